//! The CUDA backend (cargo feature `cuda`): every rank of a group in one process, one rank per
//! GPU or several ranks on one GPU, replaying a plan with device copies and NVRTC-compiled
//! reduce kernels, optionally captured once into a CUDA Graph and relaunched.
//!
//! # Loading
//!
//! The driver (`libcuda`) and NVRTC are loaded at run time (cudarc with dynamic loading), so
//! the crate builds and its binaries start on machines without CUDA. cudarc panics when a
//! library is missing; [`probe`] checks for both libraries and a device first and turns
//! their absence into a [`CudaError`], and every entry point calls it.
//!
//! # Design
//!
//! - [`lower`] turns a plan entry and a call into one ordered command list for all ranks:
//!   IR stream → CUDA stream, dependency → event record/wait, message → the receiver's fused
//!   copy or reduce reading the sender's memory directly (see its docs).
//! - [`kernels`] holds the CUDA C source: one vectorized (16-byte loads) reduce kernel per
//!   data type × operator and the `avg` division; compiled once per context with NVRTC for
//!   the device's compute capability and cached.
//! - [`CudaGroup`] owns contexts, streams, per-rank buffers, the cache of lowered calls and
//!   their captured graphs, and the helpers benchmarks need (fill, read back, event timing,
//!   device-to-device copy bandwidth).

mod call;
mod device;
mod group;
pub mod kernels;
pub mod lower;

pub use call::{Call, DeviceMap, VCall};
pub use device::memcpy_bandwidth;
pub use group::CudaGroup;
pub use lower::BlockLayout;

use thiserror::Error;

/// Errors of the CUDA backend.
#[derive(Debug, Error)]
pub enum CudaError {
    /// No usable CUDA installation or device; the message says which part is missing.
    #[error("no CUDA device ({0})")]
    Unavailable(String),
    /// A driver call failed.
    #[error("CUDA driver error in {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// NVRTC could not compile the kernels (the log is included).
    #[error("NVRTC failed to compile the kernels for {arch}: {message}")]
    Compile { arch: String, message: String },
    /// The plan or the call does not fit this backend.
    #[error("{0}")]
    Invalid(String),
    /// An error from the shared executor layers (plan loading, verification).
    #[error(transparent)]
    Exec(#[from] crate::error::ExecError),
    /// An internal invariant failed (a bug), reported instead of panicking.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Wraps a driver result with what was being done.
pub(crate) fn drv<T>(
    what: impl FnOnce() -> String,
    r: Result<T, cudarc::driver::DriverError>,
) -> Result<T, CudaError> {
    r.map_err(|source| CudaError::Driver {
        what: what(),
        source,
    })
}

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Number of CUDA devices.
    pub count: usize,
    /// Name of device 0.
    pub name: String,
    /// Compute capability of device 0.
    pub compute_capability: (i32, i32),
}

/// Checks that the CUDA driver and NVRTC libraries load and that a device exists, without
/// any chance of a panic. Call it before anything else touches CUDA; `Err` explains what is
/// missing (tests print it and skip).
pub fn probe() -> Result<DeviceInfo, CudaError> {
    // SAFETY: `is_culib_present` only tries to dlopen the library by its usual names and
    // drops the handle; it has no preconditions.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "the CUDA driver library (libcuda.so) could not be loaded".into(),
        ));
    }
    // SAFETY: as above, for libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "the NVRTC library (libnvrtc.so) could not be loaded; add the CUDA toolkit's lib \
             directory to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    // Both libraries load, so cudarc's lazy loaders cannot panic on a missing library any
    // more; a missing symbol (a driver older than the bindings) still could, so catch it.
    let found = std::panic::catch_unwind(|| -> Result<DeviceInfo, CudaError> {
        drv(|| "cuInit".into(), cudarc::driver::result::init())?;
        let count = drv(
            || "cuDeviceGetCount".into(),
            cudarc::driver::CudaContext::device_count(),
        )?;
        if count <= 0 {
            return Err(CudaError::Unavailable(
                "the driver loads but reports no device".into(),
            ));
        }
        let ctx = drv(
            || "creating the context of device 0".into(),
            cudarc::driver::CudaContext::new(0),
        )?;
        let name = drv(|| "cuDeviceGetName".into(), ctx.name())?;
        let cc = drv(
            || "reading the compute capability".into(),
            ctx.compute_capability(),
        )?;
        Ok(DeviceInfo {
            count: count as usize,
            name,
            compute_capability: cc,
        })
    });
    match found {
        Ok(r) => r.map_err(|e| match e {
            CudaError::Driver { what, source } => {
                CudaError::Unavailable(format!("{what} failed: {source}"))
            }
            other => other,
        }),
        Err(_) => Err(CudaError::Unavailable(
            "the CUDA libraries load but a call into them panicked (driver older than CUDA \
             12.6?)"
                .into(),
        )),
    }
}
