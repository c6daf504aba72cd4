//! CUDA C source of the reduce kernels, compiled at first use with NVRTC and cached per
//! context.
//!
//! One kernel `reduce_<dtype>_<op>(dst, a, b, n)` per data type × operator computes
//! `dst[i] = a[i] ⊕ b[i]`; `dst` may be `a` or `b` (each thread reads its elements before
//! writing them). When all three pointers are 16-byte aligned each thread moves 16 bytes per
//! load and keeps [`UNROLL`] loads in flight; otherwise (and for the tail) it works element by
//! element. Arithmetic matches the CPU backend bit for bit: integers wrap, `f16`/`bf16`
//! compute in `f32` and round to nearest even, min/max keep the first operand on ties and
//! NaN. `divide_<dtype>(x, n, nranks)` is the `avg` finishing pass (integer division for
//! integers, a divisor beyond the type's range gives 0 as on the CPU). The source includes no
//! headers, so NVRTC needs no include path.

use crate::dtype::{DataType, ReduceOp};
use std::fmt::Write;

/// Threads per block of every kernel.
pub const THREADS: u32 = 256;
/// 16-byte vectors each thread loads before it computes.
pub const UNROLL: u32 = 4;

/// CUDA C name of a data type's storage.
fn c_type(d: DataType) -> &'static str {
    match d {
        DataType::F32 => "float",
        DataType::F64 => "double",
        DataType::F16 | DataType::BF16 => "unsigned short",
        DataType::I8 => "signed char",
        DataType::U8 => "unsigned char",
        DataType::I32 => "int",
        DataType::U32 => "unsigned int",
        DataType::I64 => "long long",
        DataType::U64 => "unsigned long long",
    }
}

/// Short name used in kernel names.
pub fn tag(d: DataType) -> &'static str {
    match d {
        DataType::F32 => "f32",
        DataType::F64 => "f64",
        DataType::F16 => "f16",
        DataType::BF16 => "bf16",
        DataType::I8 => "i8",
        DataType::U8 => "u8",
        DataType::I32 => "i32",
        DataType::U32 => "u32",
        DataType::I64 => "i64",
        DataType::U64 => "u64",
    }
}

/// The kernel computing `op` on `d` (`avg` reduces as `sum`).
pub fn reduce_name(d: DataType, op: ReduceOp) -> String {
    let o = match op {
        ReduceOp::Sum | ReduceOp::Avg => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
    };
    format!("reduce_{}_{o}", tag(d))
}

/// The `avg` division kernel of `d`.
pub fn divide_name(d: DataType) -> String {
    format!("divide_{}", tag(d))
}

/// Every kernel name the source defines.
pub fn all_names() -> Vec<String> {
    let mut v = Vec::new();
    for d in DataType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            v.push(reduce_name(d, op));
        }
        v.push(divide_name(d));
    }
    v
}

const PRELUDE: &str = r#"
typedef unsigned long long u64_t;
__device__ __forceinline__ float h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float b2f(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short f2b(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
"#;

/// `(load, store)` expressions turning storage into the compute type and back.
fn conv(d: DataType) -> (&'static str, &'static str, &'static str) {
    // (compute type, to-compute fn, to-storage fn)
    match d {
        DataType::F16 => ("float", "h2f", "f2h"),
        DataType::BF16 => ("float", "b2f", "f2b"),
        _ => ("", "", ""),
    }
}

/// The element-wise combine expression of `op` on `d` over values `x`, `y` (storage type).
fn combine_body(d: DataType, op: ReduceOp) -> String {
    let t = c_type(d);
    let (ct, to_c, to_s) = conv(d);
    if !ct.is_empty() {
        let e = match op {
            ReduceOp::Sum | ReduceOp::Avg => "p + q",
            ReduceOp::Prod => "p * q",
            ReduceOp::Min => "(q < p) ? q : p",
            ReduceOp::Max => "(q > p) ? q : p",
        };
        return format!("float p = {to_c}(x), q = {to_c}(y); return {to_s}({e});");
    }
    let float = matches!(d, DataType::F32 | DataType::F64);
    let unsigned = match d {
        DataType::I8 | DataType::U8 | DataType::I32 | DataType::U32 => "unsigned int",
        _ => "unsigned long long",
    };
    match op {
        ReduceOp::Sum | ReduceOp::Avg if float => "return x + y;".into(),
        ReduceOp::Prod if float => "return x * y;".into(),
        ReduceOp::Sum | ReduceOp::Avg => {
            format!("return ({t})(({unsigned})x + ({unsigned})y);")
        }
        ReduceOp::Prod => format!("return ({t})(({unsigned})x * ({unsigned})y);"),
        ReduceOp::Min => "return (y < x) ? y : x;".into(),
        ReduceOp::Max => "return (y > x) ? y : x;".into(),
    }
}

fn divide_body(d: DataType) -> String {
    match d {
        DataType::F16 => "return f2h(h2f(x) / (float)n);".into(),
        DataType::BF16 => "return f2b(b2f(x) / (float)n);".into(),
        DataType::F32 => "return x / (float)n;".into(),
        DataType::F64 => "return x / (double)n;".into(),
        DataType::I8 => "return n > 127u ? (signed char)0 : (signed char)((int)x / (int)n);".into(),
        DataType::U8 => "return n > 255u ? (unsigned char)0 : (unsigned char)(x / n);".into(),
        DataType::I32 => "return n > 2147483647u ? 0 : x / (int)n;".into(),
        DataType::U32 => "return x / n;".into(),
        DataType::I64 => "return x / (long long)n;".into(),
        DataType::U64 => "return x / (unsigned long long)n;".into(),
    }
}

/// The complete CUDA C source of every kernel.
pub fn source() -> String {
    let mut s = String::from(PRELUDE);
    for d in DataType::ALL {
        let t = c_type(d);
        let vec = 16 / d.size();
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let name = reduce_name(d, op);
            let body = combine_body(d, op);
            // Writes cannot fail on a String.
            let _ = write!(
                s,
                r#"
__device__ __forceinline__ {t} op_{name}({t} x, {t} y) {{ {body} }}
extern "C" __global__ void __launch_bounds__({threads}) {name}({t}* dst, const {t}* a, const {t}* b, u64_t n) {{
    const u64_t tid = (u64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const u64_t nthreads = (u64_t)gridDim.x * blockDim.x;
    u64_t head = 0;
    if ((((u64_t)dst | (u64_t)a | (u64_t)b) & 15ull) == 0) {{
        const u64_t nv = n / {vec};
        const uint4* va = (const uint4*)a;
        const uint4* vb = (const uint4*)b;
        uint4* vd = (uint4*)dst;
        for (u64_t base = (u64_t)blockIdx.x * blockDim.x * {unroll} + threadIdx.x; base < nv; base += nthreads * {unroll}) {{
            uint4 ra[{unroll}], rb[{unroll}];
            #pragma unroll
            for (int u = 0; u < {unroll}; ++u) {{
                const u64_t i = base + (u64_t)u * blockDim.x;
                if (i < nv) {{ ra[u] = va[i]; rb[u] = vb[i]; }}
            }}
            #pragma unroll
            for (int u = 0; u < {unroll}; ++u) {{
                const u64_t i = base + (u64_t)u * blockDim.x;
                if (i < nv) {{
                    {t}* x = ({t}*)&ra[u];
                    const {t}* y = (const {t}*)&rb[u];
                    #pragma unroll
                    for (int e = 0; e < {vec}; ++e) x[e] = op_{name}(x[e], y[e]);
                    vd[i] = ra[u];
                }}
            }}
        }}
        head = nv * {vec};
    }}
    for (u64_t i = head + tid; i < n; i += nthreads) dst[i] = op_{name}(a[i], b[i]);
}}
"#,
                threads = THREADS,
                unroll = UNROLL,
            );
        }
        let name = divide_name(d);
        let body = divide_body(d);
        let _ = write!(
            s,
            r#"
__device__ __forceinline__ {t} div_{name}({t} x, unsigned int n) {{ {body} }}
extern "C" __global__ void __launch_bounds__({threads}) {name}({t}* x, u64_t n, unsigned int nranks) {{
    const u64_t nthreads = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += nthreads) x[i] = div_{name}(x[i], nranks);
}}
"#,
            threads = THREADS,
        );
    }
    s
}

/// Blocks for a launch over `n` elements of `esize` bytes on a device with `sms`
/// multiprocessors: enough to cover the data once, at most 4 blocks per multiprocessor
/// (grid-stride loops take the rest).
pub fn blocks_for(n: usize, esize: usize, sms: u32) -> u32 {
    let per_block = (THREADS * UNROLL) as usize * (16 / esize.max(1));
    let want = n.div_ceil(per_block).max(1);
    want.min((sms.max(1) * 4) as usize) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_defines_every_kernel_once() {
        let src = source();
        for name in all_names() {
            let decl = format!(" {name}(");
            assert_eq!(src.matches(&decl).count(), 1, "{name}");
        }
        assert!(!src.contains("#include"));
        // balanced braces: a cheap guard against formatting slips in the templates
        assert_eq!(src.matches('{').count(), src.matches('}').count());
    }

    #[test]
    fn launch_sizes_cover_small_and_cap_large() {
        assert_eq!(blocks_for(1, 4, 132), 1);
        assert_eq!(blocks_for(4096, 4, 132), 1);
        assert_eq!(blocks_for(4097, 4, 132), 2);
        assert_eq!(blocks_for(1 << 30, 4, 132), 528);
    }
}
