//! Finding a GPU and loading the kernels onto it. [`probe`] checks, without a panic anywhere,
//! that libcuda loads, the driver initializes and a device is there (cudarc panics on a missing
//! library instead of returning an error, so nothing else in this module runs before it). [`Gpu`]
//! then holds the context, the one stream every launch goes to, and every kernel function.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use cudarc::driver::{
    result as drv, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

pub use super::launch::{Arg, DevPtr};
use super::launch::{CudaDevice, Launch};
use super::nvrtc;

/// PTX compiled by build.rs with `nvcc` for compute_80 when the build machine had it.
#[cfg(edge_llm_prebuilt_ptx)]
const PREBUILT_PTX: &[(&str, &str)] = &[
    (
        "el_quants.cu",
        include_str!(concat!(env!("OUT_DIR"), "/el_quants.ptx")),
    ),
    (
        "el_ops.cu",
        include_str!(concat!(env!("OUT_DIR"), "/el_ops.ptx")),
    ),
];
#[cfg(not(edge_llm_prebuilt_ptx))]
const PREBUILT_PTX: &[(&str, &str)] = &[];

/// Runs `f` with panics turned into errors and the panic message kept off stderr: cudarc panics
/// where a symbol or library is missing, and a start-up check must report that, not crash.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            bail!("{what}: {msg}")
        }
    }
}

/// Whether a CUDA GPU can be used: Ok(its name) or an error that says why not, starting with
/// "no CUDA GPU found" when there is none. Never panics and creates no context.
pub fn probe() -> Result<String> {
    // SAFETY: only tries to dlopen libcuda by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!("no CUDA GPU found (libcuda not loadable)");
    }
    let name = no_panic("no CUDA GPU found (the CUDA driver is unusable)", || {
        drv::init().map_err(|e| anyhow::anyhow!("no CUDA GPU found (cuInit: {e:?})"))?;
        let n = drv::device::get_count()
            .map_err(|e| anyhow::anyhow!("no CUDA GPU found (cuDeviceGetCount: {e:?})"))?;
        if n < 1 {
            bail!("no CUDA GPU found (the driver reports no device)");
        }
        let dev = drv::device::get(0)
            .map_err(|e| anyhow::anyhow!("no CUDA GPU found (cuDeviceGet: {e:?})"))?;
        drv::device::get_name(dev).map_err(|e| anyhow::anyhow!("cuDeviceGetName: {e:?}"))
    })?;
    if PREBUILT_PTX.is_empty() && !nvrtc::available() {
        bail!(
            "CUDA GPU {name} found, but libnvrtc is not loadable to compile the kernels (install the CUDA toolkit or the \
             PyPI wheel nvidia-cuda-nvrtc-cu12 and add its lib/ to LD_LIBRARY_PATH, or build with nvcc on PATH)"
        );
    }
    Ok(name)
}

/// One GPU with the kernels loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub compute_capability: (i32, i32),
    functions: HashMap<String, CudaFunction>,
    /// How the kernels were loaded ("PTX from nvcc" or "NVRTC compute_XY").
    pub kernels_from: String,
    /// `EDGE_LLM_CUDA_PROFILE=1`: per-kernel GPU times.
    profile: super::profile::Profile,
}

impl Gpu {
    /// Opens device 0 and loads every kernel: the PTX build.rs made with nvcc if there is one
    /// and the driver takes it, else the embedded sources compiled now with NVRTC.
    pub fn new() -> Result<Gpu> {
        let name = probe()?;
        no_panic("starting CUDA", || Self::open(name))
    }

    fn open(name: String) -> Result<Gpu> {
        let ctx = CudaContext::new(0)
            .map_err(|e| anyhow::anyhow!("creating a CUDA context on {name}: {e:?}"))?;
        // One stream does all the work, so cudarc's per-buffer event tracking only costs.
        // SAFETY: no buffer exists yet, and everything runs on the one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let cc = ctx
            .compute_capability()
            .map_err(|e| anyhow::anyhow!("compute capability: {e:?}"))?;
        if cc < (6, 1) {
            bail!(
                "{name} has compute capability {}.{}; the kernels need 6.1 or newer (__dp4a)",
                cc.0,
                cc.1
            );
        }
        let mut functions = HashMap::new();
        let mut kernels_from = String::new();
        for program in nvrtc::PROGRAMS {
            let prebuilt = PREBUILT_PTX
                .iter()
                .find(|(p, _)| p == program)
                .map(|(_, ptx)| *ptx);
            let module = match prebuilt.map(|ptx| ctx.load_module(Ptx::from_src(ptx))) {
                Some(Ok(m)) => {
                    kernels_from = "PTX from nvcc (compute_80)".into();
                    m
                }
                other => {
                    if let Some(Err(e)) = other {
                        eprintln!("the driver refused the nvcc-built PTX of {program} ({e:?}); compiling it with NVRTC");
                    }
                    let (ptx, arch) = compile_for(program, cc)?;
                    kernels_from = format!("NVRTC {arch}");
                    ctx.load_module(Ptx::from_src(ptx))
                        .map_err(|e| anyhow::anyhow!("loading {program} ({arch}): {e:?}"))?
                }
            };
            for entry in nvrtc::entry_points(program) {
                let f = module
                    .load_function(&entry)
                    .map_err(|e| anyhow::anyhow!("kernel {entry}: {e:?}"))?;
                functions.insert(entry, f);
            }
        }
        Ok(Gpu {
            ctx,
            stream,
            name,
            compute_capability: cc,
            functions,
            kernels_from,
            profile: super::profile::Profile::from_env(),
        })
    }

    /// Makes this GPU's context current on the calling thread (the engine thread is not the
    /// one that created it).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| anyhow::anyhow!("binding the CUDA context: {e:?}"))
    }
}

impl Launch for Gpu {
    /// Launches kernel `name` on the stream: `grid` blocks of `block` threads.
    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        let f = self
            .functions
            .get(name)
            .with_context(|| format!("kernel {name} is not loaded"))?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if grid.1 > 65535 || grid.2 > 65535 {
            bail!("kernel {name}: grid {grid:?} exceeds the y/z limit of 65535 blocks");
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the wrappers in kernels.rs check every buffer against the shapes the kernel
        // reads and writes before they launch it; argument types follow the kernel signatures.
        self.profile
            .launch(&self.ctx, &self.stream, name, || unsafe { b.launch(cfg) })
            .map_err(|e| anyhow::anyhow!("launching {name}: {e:?}"))?;
        Ok(())
    }
}

impl CudaDevice for Gpu {
    type Buf = CudaSlice<u8>;

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros(bytes.max(1))
            .map_err(|e| anyhow::anyhow!("allocating {bytes} bytes on the GPU: {e:?}"))
    }

    fn upload_bytes(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        self.stream
            .clone_htod(bytes)
            .map_err(|e| anyhow::anyhow!("copying {} bytes to the GPU: {e:?}", bytes.len()))
    }

    fn download_bytes(&self, buf: &CudaSlice<u8>, out: &mut [u8]) -> Result<()> {
        if out.len() > buf.len() {
            bail!(
                "downloading {} bytes of a {}-byte buffer",
                out.len(),
                buf.len()
            );
        }
        if !out.is_empty() {
            self.stream
                .memcpy_dtoh(&buf.slice(0..out.len()), out)
                .map_err(|e| anyhow::anyhow!("copying from the GPU: {e:?}"))?;
        }
        self.synchronize()
    }

    fn ptr(&self, buf: &CudaSlice<u8>) -> DevPtr {
        let (addr, _sync) = buf.device_ptr(&self.stream);
        DevPtr {
            addr,
            bytes: buf.len(),
        }
    }

    fn bind(&self) -> Result<()> {
        Gpu::bind(self)
    }

    fn synchronize(&self) -> Result<()> {
        self.profile
            .synchronize(|| self.stream.synchronize())
            .map_err(|e| anyhow::anyhow!("waiting for the GPU: {e:?}"))
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| anyhow::anyhow!("cuMemGetInfo: {e:?}"))
    }
}

/// PTX for this device from NVRTC: compute_{major}{minor}, or compute_80 (which every newer GPU
/// runs through the driver's JIT) when this NVRTC does not know the device's own.
fn compile_for(program: &str, cc: (i32, i32)) -> Result<(String, String)> {
    let own = format!("compute_{}{}", cc.0, cc.1);
    match nvrtc::compile(program, &own, &[]) {
        Ok(c) => Ok((c.ptx, own)),
        Err(e) if cc >= (8, 0) => {
            let c = nvrtc::compile(program, "compute_80", &[])
                .with_context(|| format!("after {own} failed: {e:#}"))?;
            Ok((c.ptx, "compute_80".into()))
        }
        Err(e) => Err(e),
    }
}
