//! A group's devices: their contexts, streams and reduce kernels (NVRTC-compiled once per
//! architecture), device buffers, peer access between them, and the copy bandwidth probe.

use super::kernels;
use super::{CudaError, drv, probe};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, result, sys};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Device memory from `cuMemAlloc` (plain allocations, so peers can map them).
pub(super) struct DeviceBuf {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) ctx: Arc<CudaContext>,
}

impl DeviceBuf {
    pub(super) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuf, CudaError> {
        drv(|| "binding the context".into(), ctx.bind_to_thread())?;
        let size = bytes.max(16);
        // SAFETY: plain allocation of `size` bytes in the current context, owned by the
        // returned value and freed in its Drop.
        let ptr = drv(
            || format!("allocating {size} bytes on device {}", ctx.ordinal()),
            unsafe { result::malloc_sync(size) },
        )?;
        let buf = DeviceBuf {
            ptr,
            bytes,
            ctx: ctx.clone(),
        };
        // SAFETY: `ptr` is valid for `size` bytes.
        drv(|| "clearing a new buffer".into(), unsafe {
            sys::cuMemsetD8_v2(ptr, 0, size).result()
        })?;
        Ok(buf)
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_sync` in this context and freed once; the group
            // synchronizes its devices before dropping buffers that work may still use.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// The compiled kernels of one context.
pub(super) struct KernelSet {
    pub(super) _module: Arc<CudaModule>,
    pub(super) funcs: HashMap<String, CudaFunction>,
}

/// PTX per target architecture, compiled once per process.
pub(super) fn ptx_for(arch: &str) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    static CACHE: OnceLock<Mutex<HashMap<String, cudarc::nvrtc::Ptx>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache
        .lock()
        .map_err(|_| CudaError::Internal("kernel cache lock poisoned".into()))?;
    if let Some(p) = map.get(arch) {
        return Ok(p.clone());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![
            format!("--gpu-architecture={arch}"),
            "-default-device".into(),
        ],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernels::source(), opts).map_err(|e| {
        let message = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        };
        CudaError::Compile {
            arch: arch.to_string(),
            message,
        }
    })?;
    map.insert(arch.to_string(), ptx.clone());
    Ok(ptx)
}

/// One device of the group.
pub(super) struct Dev {
    pub(super) ctx: Arc<CudaContext>,
    /// The stream calls are launched, forked and joined on, and graphs captured from.
    pub(super) main: Arc<CudaStream>,
    pub(super) sms: u32,
    pub(super) arch: String,
    pub(super) kernels: OnceLock<Result<Arc<KernelSet>, String>>,
}

impl Dev {
    pub(super) fn kernels(&self) -> Result<Arc<KernelSet>, CudaError> {
        let got = self.kernels.get_or_init(|| {
            let load = || -> Result<Arc<KernelSet>, CudaError> {
                let ptx = ptx_for(&self.arch)?;
                let module = drv(
                    || "loading the kernel module".into(),
                    self.ctx.load_module(ptx),
                )?;
                let mut funcs = HashMap::new();
                for name in kernels::all_names() {
                    let f = drv(
                        || format!("looking up kernel {name}"),
                        module.load_function(&name),
                    )?;
                    funcs.insert(name, f);
                }
                Ok(Arc::new(KernelSet {
                    _module: module,
                    funcs,
                }))
            };
            load().map_err(|e| e.to_string())
        });
        got.clone().map_err(CudaError::Invalid)
    }
}

/// Enables peer access between every pair of devices that supports it; returns the matrix
/// of direct access (by device index).
pub(super) fn enable_peer_access(devs: &[Dev]) -> Result<Vec<Vec<bool>>, CudaError> {
    let n = devs.len();
    let mut direct = vec![vec![false; n]; n];
    for a in 0..n {
        direct[a][a] = true;
        for b in 0..n {
            if a == b {
                continue;
            }
            let mut can = 0i32;
            // SAFETY: plain query on two valid device handles.
            let ok = unsafe {
                sys::cuDeviceCanAccessPeer(
                    &mut can,
                    devs[a].ctx.cu_device(),
                    devs[b].ctx.cu_device(),
                )
            }
            .result()
            .is_ok();
            if !ok || can == 0 {
                continue;
            }
            drv(
                || "binding the context".into(),
                devs[a].ctx.bind_to_thread(),
            )?;
            // SAFETY: enables access from the current context (a) to b's context; both live
            // as long as the group.
            let r = unsafe { sys::cuCtxEnablePeerAccess(devs[b].ctx.cu_ctx(), 0) };
            if r == sys::CUresult::CUDA_SUCCESS
                || r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            {
                direct[a][b] = true;
            } else {
                tracing::warn!(a, b, ?r, "cuda: peer access not enabled; staging copies");
            }
        }
    }
    Ok(direct)
}

/// Device-to-device copy bandwidth on device `ordinal`: copies `bytes` `iters` times
/// between two buffers and returns `(seconds per copy, GB/s counting bytes copied)`;
/// double the rate to count bytes read plus written.
pub fn memcpy_bandwidth(ordinal: usize, bytes: usize, iters: u32) -> Result<(f64, f64), CudaError> {
    probe()?;
    let ctx = drv(
        || format!("creating the context of device {ordinal}"),
        CudaContext::new(ordinal),
    )?;
    let stream = drv(|| "creating a stream".into(), ctx.new_stream())?;
    let a = DeviceBuf::new(&ctx, bytes)?;
    let b = DeviceBuf::new(&ctx, bytes)?;
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = drv(|| "creating an event".into(), ctx.new_event(flags))?;
    let end = drv(|| "creating an event".into(), ctx.new_event(flags))?;
    let copy = |dst: &DeviceBuf, src: &DeviceBuf| {
        // SAFETY: two distinct live allocations of `bytes` bytes each.
        drv(|| "cuMemcpyDtoDAsync".into(), unsafe {
            result::memcpy_dtod_async(dst.ptr, src.ptr, bytes, stream.cu_stream())
        })
    };
    copy(&b, &a)?;
    drv(|| "recording".into(), start.record(&stream))?;
    for i in 0..iters.max(1) {
        if i % 2 == 0 {
            copy(&b, &a)?
        } else {
            copy(&a, &b)?
        }
    }
    drv(|| "recording".into(), end.record(&stream))?;
    drv(|| "synchronizing".into(), end.synchronize())?;
    let ms = drv(|| "reading the timer".into(), start.elapsed_ms(&end))?;
    let secs = f64::from(ms) * 1e-3 / f64::from(iters.max(1));
    drv(|| "synchronizing".into(), stream.synchronize())?;
    Ok((secs, bytes as f64 / secs / 1e9))
}
