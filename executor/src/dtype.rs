//! Element types, reduction operators and the vectorizable reduction kernels.
//!
//! The engine never dispatches on data type or operator inside a loop: a call picks one
//! [`Kernels`] table (plain function pointers monomorphised per element type × operator) and
//! every reduction then runs a tight loop over slices that the compiler auto-vectorizes.
//! Integer arithmetic wraps (as in NCCL); `f16`/`bf16` compute through `f32`.

use half::{bf16, f16};

/// Data types a collective can carry (names follow nccl-tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
}

/// Bytes of the widest element type (`f64`, `i64`, `u64`).
pub const MAX_ELEMENT_BYTES: usize = 8;

impl DataType {
    /// Every data type.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// The nccl-tests name (`float`, `half`, `bfloat16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
        }
    }

    /// Parses an nccl-tests name; also accepts Rust names (`f32`, `bf16`, `i8`, …).
    pub fn from_name(name: &str) -> Option<DataType> {
        let lower = name.to_ascii_lowercase();
        DataType::ALL.into_iter().find(|d| {
            d.name() == lower
                || match d {
                    DataType::F32 => lower == "f32" || lower == "float32",
                    DataType::F64 => lower == "f64" || lower == "float64",
                    DataType::F16 => lower == "f16" || lower == "float16",
                    DataType::BF16 => lower == "bf16",
                    DataType::I8 => lower == "i8",
                    DataType::U8 => lower == "u8",
                    DataType::I32 => lower == "i32" || lower == "int",
                    DataType::U32 => lower == "u32",
                    DataType::I64 => lower == "i64",
                    DataType::U64 => lower == "u64",
                }
        })
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    /// Sum, then division by the number of ranks (integer division for integer types).
    Avg,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The nccl-tests name (`sum`, `prod`, `min`, `max`, `avg`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Case-insensitive parse of an operator name.
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(name))
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type collectives can carry. Sealed: implemented for the ten supported element types.
pub trait Element: Copy + Send + Sync + PartialOrd + Default + 'static + sealed::Sealed {
    /// The runtime tag of this type.
    const DTYPE: DataType;
    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(a: Self, b: Self) -> Self;
    /// `self / n` (integer division for integers), used by [`ReduceOp::Avg`].
    fn div_count(self, n: u32) -> Self;
    /// Converts a small integer (test data, reference values).
    fn from_i64(v: i64) -> Self;
    /// Converts to `f64` (for comparisons in tools).
    fn to_f64(self) -> f64;
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn div_count(self, n: u32) -> Self {
                // n >= 1 and fits every type except i8/u8 for n > 127; saturate the divisor
                // there (a quotient by more than the type's range is 0 or -1/0 anyway).
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => self.wrapping_div(d),
                    _ => <$t>::default(),
                }
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
int_element!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

macro_rules! float_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn div_count(self, n: u32) -> Self { self / (n as $t) }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
float_element!(f32 => F32, f64 => F64);

macro_rules! half_element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() * b.to_f32()) }
            #[inline(always)]
            fn div_count(self, n: u32) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { <$t>::from_f32(v as f32) }
            #[inline(always)]
            fn to_f64(self) -> f64 { self.to_f64() }
        }
    )*};
}
half_element!(f16 => F16, bf16 => BF16);

/// A binary reduction operator on one element type, as a zero-sized type so that kernels
/// are monomorphised per operator.
pub trait Combine<T: Element> {
    /// Combines two elements.
    fn combine(a: T, b: T) -> T;
}

/// `a + b`.
pub struct SumOp;
/// `a * b`.
pub struct ProdOp;
/// The smaller element (the first on ties and NaN).
pub struct MinOp;
/// The larger element (the first on ties and NaN).
pub struct MaxOp;

impl<T: Element> Combine<T> for SumOp {
    #[inline(always)]
    fn combine(a: T, b: T) -> T {
        T::add(a, b)
    }
}
impl<T: Element> Combine<T> for ProdOp {
    #[inline(always)]
    fn combine(a: T, b: T) -> T {
        T::mul(a, b)
    }
}
impl<T: Element> Combine<T> for MinOp {
    #[inline(always)]
    fn combine(a: T, b: T) -> T {
        if b < a { b } else { a }
    }
}
impl<T: Element> Combine<T> for MaxOp {
    #[inline(always)]
    fn combine(a: T, b: T) -> T {
        if b > a { b } else { a }
    }
}

/// Applies the operator over whole slices (what the reference implementation and tests use).
pub fn combine_slices<T: Element>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    fn go<T: Element, O: Combine<T>>(acc: &mut [T], x: &[T]) {
        for (a, b) in acc.iter_mut().zip(x) {
            *a = O::combine(*a, *b);
        }
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => go::<T, SumOp>(acc, x),
        ReduceOp::Prod => go::<T, ProdOp>(acc, x),
        ReduceOp::Min => go::<T, MinOp>(acc, x),
        ReduceOp::Max => go::<T, MaxOp>(acc, x),
    }
}

/// `dst[i] = dst[i] ⊕ x[i]` for `n` elements; `dst` and `x` must not overlap.
pub type InPlaceKernel = unsafe fn(dst: *mut u8, x: *const u8, n: usize);
/// `dst[i] = a[i] ⊕ b[i]` for `n` elements; `dst` must not overlap `a` or `b`.
pub type ThreeWayKernel = unsafe fn(dst: *mut u8, a: *const u8, b: *const u8, n: usize);
/// `dst[i] = a[i] ⊕ b[i]` element by element through raw pointers: correct for any overlap
/// in which each output element is written after both of its inputs were read.
pub type ScalarKernel = unsafe fn(dst: *mut u8, a: *const u8, b: *const u8, n: usize);
/// `x[i] = x[i] / nranks` over `n` elements (the finishing pass of [`ReduceOp::Avg`]).
pub type DivKernel = unsafe fn(x: *mut u8, n: usize, nranks: u32);

/// The kernels of one element type × operator.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// Element size in bytes.
    pub esize: usize,
    pub in_place: InPlaceKernel,
    pub three_way: ThreeWayKernel,
    pub scalar: ScalarKernel,
    /// Set for [`ReduceOp::Avg`].
    pub finish: Option<DivKernel>,
}

/// # Safety
/// `dst` and `x` valid for `n` elements of `T`, aligned, not overlapping.
#[inline(always)]
unsafe fn k_in_place<T: Element, O: Combine<T>>(dst: *mut u8, x: *const u8, n: usize) {
    // SAFETY: guaranteed by the caller.
    let (d, s) = unsafe {
        (
            std::slice::from_raw_parts_mut(dst.cast::<T>(), n),
            std::slice::from_raw_parts(x.cast::<T>(), n),
        )
    };
    for (a, b) in d.iter_mut().zip(s) {
        *a = O::combine(*a, *b);
    }
}

/// # Safety
/// All pointers valid for `n` elements of `T`, aligned; `dst` overlaps neither input.
#[inline(always)]
unsafe fn k_three_way<T: Element, O: Combine<T>>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
) {
    // SAFETY: guaranteed by the caller.
    let (d, x, y) = unsafe {
        (
            std::slice::from_raw_parts_mut(dst.cast::<T>(), n),
            std::slice::from_raw_parts(a.cast::<T>(), n),
            std::slice::from_raw_parts(b.cast::<T>(), n),
        )
    };
    for ((o, p), q) in d.iter_mut().zip(x).zip(y) {
        *o = O::combine(*p, *q);
    }
}

/// # Safety
/// All pointers valid for `n` elements of `T` and aligned.
unsafe fn k_scalar<T: Element, O: Combine<T>>(dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    let (d, x, y) = (dst.cast::<T>(), a.cast::<T>(), b.cast::<T>());
    for i in 0..n {
        // SAFETY: in bounds by the caller's contract; raw reads/writes tolerate overlap.
        unsafe { d.add(i).write(O::combine(x.add(i).read(), y.add(i).read())) };
    }
}

/// # Safety
/// `x` valid for `n` elements of `T`, aligned.
unsafe fn k_div<T: Element>(x: *mut u8, n: usize, nranks: u32) {
    // SAFETY: guaranteed by the caller.
    let s = unsafe { std::slice::from_raw_parts_mut(x.cast::<T>(), n) };
    for v in s {
        *v = v.div_count(nranks);
    }
}

/// The same loops compiled for AVX2 (twice the vector width of the x86-64 baseline the
/// crate is built for); chosen at run time where the CPU has it.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Combine, Element};

    /// # Safety
    /// As [`super::k_in_place`], and the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn in_place<T: Element, O: Combine<T>>(dst: *mut u8, x: *const u8, n: usize) {
        // SAFETY: forwarded contract.
        unsafe { super::k_in_place::<T, O>(dst, x, n) }
    }

    /// # Safety
    /// As [`super::k_three_way`], and the CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn three_way<T: Element, O: Combine<T>>(
        dst: *mut u8,
        a: *const u8,
        b: *const u8,
        n: usize,
    ) {
        // SAFETY: forwarded contract.
        unsafe { super::k_three_way::<T, O>(dst, a, b, n) }
    }
}

/// Whether the AVX2 kernels may run here (detected once, then a cached load).
fn use_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Baseline-compiled (not inlined) instances of the kernels.
///
/// # Safety
/// As [`k_in_place`].
unsafe fn k_in_place_base<T: Element, O: Combine<T>>(dst: *mut u8, x: *const u8, n: usize) {
    // SAFETY: forwarded contract.
    unsafe { k_in_place::<T, O>(dst, x, n) }
}

/// # Safety
/// As [`k_three_way`].
unsafe fn k_three_way_base<T: Element, O: Combine<T>>(
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
) {
    // SAFETY: forwarded contract.
    unsafe { k_three_way::<T, O>(dst, a, b, n) }
}

fn kernels_of<T: Element, O: Combine<T>>(finish: bool) -> Kernels {
    let mut k = Kernels {
        esize: std::mem::size_of::<T>(),
        in_place: k_in_place_base::<T, O>,
        three_way: k_three_way_base::<T, O>,
        scalar: k_scalar::<T, O>,
        finish: finish.then_some(k_div::<T> as DivKernel),
    };
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY (of later calls): only installed where the CPU supports AVX2.
        k.in_place = avx2::in_place::<T, O>;
        k.three_way = avx2::three_way::<T, O>;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = use_avx2();
    k
}

fn kernels_for<T: Element>(op: ReduceOp) -> Kernels {
    match op {
        ReduceOp::Sum => kernels_of::<T, SumOp>(false),
        ReduceOp::Avg => kernels_of::<T, SumOp>(true),
        ReduceOp::Prod => kernels_of::<T, ProdOp>(false),
        ReduceOp::Min => kernels_of::<T, MinOp>(false),
        ReduceOp::Max => kernels_of::<T, MaxOp>(false),
    }
}

impl Kernels {
    /// The kernel table for a data type and operator.
    pub fn new(dtype: DataType, op: ReduceOp) -> Kernels {
        match dtype {
            DataType::F32 => kernels_for::<f32>(op),
            DataType::F64 => kernels_for::<f64>(op),
            DataType::F16 => kernels_for::<f16>(op),
            DataType::BF16 => kernels_for::<bf16>(op),
            DataType::I8 => kernels_for::<i8>(op),
            DataType::U8 => kernels_for::<u8>(op),
            DataType::I32 => kernels_for::<i32>(op),
            DataType::U32 => kernels_for::<u32>(op),
            DataType::I64 => kernels_for::<i64>(op),
            DataType::U64 => kernels_for::<u64>(op),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_name(d.name()), Some(d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(o.name()), Some(o));
        }
        assert_eq!(DataType::from_name("bf16"), Some(DataType::BF16));
        assert_eq!(DataType::from_name("complex"), None);
    }

    #[test]
    fn kernels_match_combine_slices() {
        let a: Vec<i32> = (0..37).map(|v| v * 3 - 50).collect();
        let b: Vec<i32> = (0..37).map(|v| 40 - v * 2).collect();
        for op in ReduceOp::ALL {
            let k = Kernels::new(DataType::I32, op);
            let mut want = a.clone();
            combine_slices(op, &mut want, &b);
            let mut got = vec![0i32; 37];
            // SAFETY: distinct buffers of 37 i32.
            unsafe {
                (k.three_way)(
                    got.as_mut_ptr().cast(),
                    a.as_ptr().cast(),
                    b.as_ptr().cast(),
                    37,
                )
            };
            assert_eq!(got, want, "{op}");
            let mut inplace = a.clone();
            // SAFETY: distinct buffers of 37 i32.
            unsafe { (k.in_place)(inplace.as_mut_ptr().cast(), b.as_ptr().cast(), 37) };
            assert_eq!(inplace, want, "{op}");
        }
        assert_eq!(i8::div_count(-100, 300), 0);
        assert_eq!(u32::div_count(9, 2), 4);
    }

    /// The dispatched kernels (AVX2 where the CPU has it) agree with the reference over
    /// every length around the vector widths, for each element size and operator.
    #[test]
    fn dispatched_kernels_match_the_reference_at_every_tail_length() {
        fn check<T: Element>(make: impl Fn(usize) -> T) {
            for op in ReduceOp::ALL {
                let k = Kernels::new(T::DTYPE, op);
                for n in 0..=67usize {
                    let a: Vec<T> = (0..n).map(&make).collect();
                    let b: Vec<T> = (0..n).map(|i| make(i * 7 + 3)).collect();
                    let mut want = a.clone();
                    combine_slices(op, &mut want, &b);
                    let mut got = vec![T::default(); n];
                    let mut inplace = a.clone();
                    // SAFETY: distinct buffers of `n` elements each.
                    unsafe {
                        (k.three_way)(
                            got.as_mut_ptr().cast(),
                            a.as_ptr().cast(),
                            b.as_ptr().cast(),
                            n,
                        );
                        (k.in_place)(inplace.as_mut_ptr().cast(), b.as_ptr().cast(), n);
                    }
                    let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} {op} n={n}", T::DTYPE.name());
                    assert_eq!(
                        bits(&inplace),
                        bits(&want),
                        "{} {op} n={n}",
                        T::DTYPE.name()
                    );
                }
            }
        }
        check::<f32>(|i| f32::from_i64((i % 11) as i64 - 5));
        check::<f64>(|i| f64::from_i64((i % 13) as i64 - 6));
        check::<f16>(|i| f16::from_i64((i % 9) as i64 - 4));
        check::<bf16>(|i| bf16::from_i64((i % 9) as i64 - 4));
        check::<i8>(|i| i8::from_i64((i % 7) as i64 - 3));
        check::<u8>(|i| u8::from_i64((i % 5) as i64));
        check::<i32>(|i| i32::from_i64((i % 17) as i64 - 8));
        check::<u64>(|i| u64::from_i64((i % 19) as i64));
    }
}
