//! `_hccl.array_info`: a NumPy array's address, length and element type in one native call.
//!
//! The communicator's per-call cost in Python was mostly spent learning where an array lives:
//! `__array_interface__` builds a dictionary of strings on every access, and the checks
//! around it read several more attributes (about 6 µs per array). NumPy's C-level array
//! interface, `__array_struct__`, hands the same facts over as a `PyArrayInterface` struct in
//! a capsule (a documented, stable layout: "The array interface protocol", version 3), which
//! this reads in a fraction of a microsecond. The module is built for the stable ABI from
//! Python 3.9, which has no buffer protocol, so the buffer protocol is not an option here.
//!
//! It answers only for the common case: a C-contiguous, aligned array in native byte order
//! whose element type the executor supports (and writable, where asked). Anything else gets
//! `None`, and the Python side (`hccl/comm.py`, `_Array`) takes its general path, which says
//! precisely what is wrong or handles the object another way (PyTorch tensors, buffers).

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::os::raw::{c_char, c_int, c_void};

/// NumPy's `PyArrayInterface` (numpy/ndarraytypes.h).
#[repr(C)]
struct ArrayInterface {
    two: c_int,
    nd: c_int,
    typekind: c_char,
    itemsize: c_int,
    flags: c_int,
    shape: *const isize,
    _strides: *const isize,
    data: *mut c_void,
    _descr: *mut pyo3::ffi::PyObject,
}

const C_CONTIGUOUS: c_int = 0x0001;
const ALIGNED: c_int = 0x0100;
const NOT_SWAPPED: c_int = 0x0200;
const WRITEABLE: c_int = 0x0400;

/// The executor's element type of a NumPy type kind and item size, by the names
/// `hccl.Communicator` passes on.
fn dtype_name(kind: u8, size: c_int) -> Option<&'static str> {
    Some(match (kind, size) {
        (b'f', 2) => "float16",
        (b'f', 4) => "float32",
        (b'f', 8) => "float64",
        (b'i', 1) => "int8",
        (b'i', 4) => "int32",
        (b'i', 8) => "int64",
        (b'u', 1) => "uint8",
        (b'u', 4) => "uint32",
        (b'u', 8) => "uint64",
        _ => return None,
    })
}

/// `(address, elements, element type)` of `obj` when it exposes NumPy's array interface and
/// is a C-contiguous, aligned array in native byte order of a supported element type (and
/// writable if `writable`); otherwise `None`, for the caller's general path to explain.
#[pyfunction]
pub(crate) fn array_info(
    obj: &Bound<'_, PyAny>,
    writable: bool,
) -> Option<(usize, usize, &'static str)> {
    let attr = obj
        .getattr(pyo3::intern!(obj.py(), "__array_struct__"))
        .ok()?;
    let capsule = attr.cast::<PyCapsule>().ok()?;
    // NumPy's capsule has no name.
    let ptr = capsule.pointer_checked(None).ok()?;
    // SAFETY: a capsule named nothing that `__array_struct__` returned holds a
    // `PyArrayInterface` (the protocol's contract), which `two == 2` confirms before any other
    // field is trusted; the capsule (alive until the end of this function) keeps the struct
    // and its shape array alive, and no Python code runs while they are read.
    unsafe {
        let ai = &*ptr.as_ptr().cast::<ArrayInterface>();
        if ai.two != 2 || ai.nd < 0 || (ai.nd > 0 && ai.shape.is_null()) {
            return None;
        }
        let need = C_CONTIGUOUS | ALIGNED | NOT_SWAPPED | if writable { WRITEABLE } else { 0 };
        if ai.flags & need != need {
            return None;
        }
        let dtype = dtype_name(ai.typekind as u8, ai.itemsize)?;
        let mut len = 1usize;
        for d in 0..ai.nd as usize {
            len = len.checked_mul(usize::try_from(*ai.shape.add(d)).ok()?)?;
        }
        Some((ai.data as usize, len, dtype))
    }
}
