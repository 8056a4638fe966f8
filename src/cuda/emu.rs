//! The CUDA kernels run on the CPU: [`Emu`] is a [`CudaDevice`] whose memory is host memory and
//! whose launches go to the kernels of `csrc/cuda/` compiled by g++ (`csrc/cuda/emu/`: each CUDA
//! thread a fiber, barriers and warp shuffles emulated). It lets every kernel, and the whole
//! CUDA forward pass, be tested on machines without a GPU. Far too slow to serve a real model
//! (a thread switch per barrier), fast enough for kernel tests and a tiny model.
//!
//! Every launch is checked twice before it runs: each pointer argument must lie inside a live
//! buffer of this device, and the launch table checks the argument kinds against the kernel's
//! real parameters. With a trace file set ([`Emu::with_trace`]), every launch is also recorded
//! with the buffers it touches, so that `el_emu_replay` can run it again under AddressSanitizer
//! with each buffer allocated to its exact size.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};

use super::launch::{Arg, CudaDevice, DevPtr, Launch};

#[repr(C)]
struct EmuArg {
    kind: i32,
    pad: i32,
    bits: u64,
}

const KIND_PTR: i32 = 0;
const KIND_I64: i32 = 1;
const KIND_I32: i32 = 2;
const KIND_F32: i32 = 3;
/// el_emu_runtime.h's EL_EMU_REVERSE.
const FLAG_REVERSE: c_int = 1;

extern "C" {
    fn el_emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        args: *const EmuArg,
        n_args: c_int,
        flags: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn el_emu_kernel_count() -> c_int;
    fn el_emu_kernel_name(i: c_int) -> *const c_char;
}

/// Every kernel the emulator's launch table holds.
pub fn kernel_names() -> Vec<String> {
    // SAFETY: the table's names are static C strings.
    (0..unsafe { el_emu_kernel_count() })
        .filter_map(|i| {
            let p = unsafe { el_emu_kernel_name(i) };
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        })
        .collect()
}

/// Live buffers by address: their sizes, to check pointer arguments and to trace launches.
type Registry = Arc<Mutex<BTreeMap<u64, usize>>>;

/// A buffer of emulated device memory: host memory, 64-byte aligned, zeroed.
pub struct EmuBuf {
    ptr: *mut u8,
    bytes: usize,
    layout: Layout,
    registry: Registry,
}

// SAFETY: the buffer is plain memory owned by this value; kernels write it only during launches
// made through the device that owns the registry.
unsafe impl Send for EmuBuf {}
unsafe impl Sync for EmuBuf {}

impl Drop for EmuBuf {
    fn drop(&mut self) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(self.ptr as u64));
        // SAFETY: allocated with this layout in alloc_zeroed.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// The emulated device.
pub struct Emu {
    reverse: bool,
    registry: Registry,
    trace: Option<Mutex<std::io::BufWriter<std::fs::File>>>,
}

impl Default for Emu {
    fn default() -> Self {
        Emu::new()
    }
}

impl Emu {
    pub fn new() -> Emu {
        Emu {
            reverse: false,
            registry: Arc::new(Mutex::new(BTreeMap::new())),
            trace: None,
        }
    }

    /// The same device, but each block's threads start, and resume after every barrier, last
    /// thread first: a kernel whose result depends on that order has a race.
    pub fn reversed() -> Emu {
        Emu {
            reverse: true,
            ..Emu::new()
        }
    }

    /// Records every launch, with the bytes of every buffer it points into, to `path` (the
    /// input of `csrc/cuda/emu/el_emu_replay.cpp`).
    pub fn with_trace(mut self, path: &std::path::Path) -> Result<Emu> {
        let f = std::fs::File::create(path)
            .with_context(|| format!("creating the launch trace {}", path.display()))?;
        self.trace = Some(Mutex::new(std::io::BufWriter::new(f)));
        Ok(self)
    }

    /// Flushes the trace file.
    pub fn finish_trace(&self) -> Result<()> {
        if let Some(t) = &self.trace {
            t.lock().unwrap_or_else(|e| e.into_inner()).flush()?;
        }
        Ok(())
    }

    /// The live buffer that holds address `addr`: (its base, its size).
    fn buffer_of(&self, addr: u64) -> Option<(u64, usize)> {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let (&base, &bytes) = reg.range(..=addr).next_back()?;
        // One past the end is allowed (an empty tail of a buffer).
        (addr <= base + bytes as u64).then_some((base, bytes))
    }

    fn record(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        let Some(t) = &self.trace else {
            return Ok(());
        };
        let mut bufs: Vec<(u64, usize)> = Vec::new();
        let mut rec = Vec::new();
        let put32 = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
        put32(&mut rec, name.len() as u32);
        rec.extend_from_slice(name.as_bytes());
        for g in [grid.0, grid.1, grid.2, block] {
            put32(&mut rec, g);
        }
        put32(&mut rec, args.len() as u32);
        for a in args {
            let (kind, bits) = encode(a);
            rec.extend_from_slice(&kind.to_le_bytes());
            if let Arg::Ptr(p) = *a {
                let (base, bytes) = self.buffer_of(p).context("pointer outside every buffer")?;
                let i = match bufs.iter().position(|b| b.0 == base) {
                    Some(i) => i,
                    None => {
                        bufs.push((base, bytes));
                        bufs.len() - 1
                    }
                };
                put32(&mut rec, i as u32);
                rec.extend_from_slice(&(p - base).to_le_bytes());
            } else {
                put32(&mut rec, 0);
                rec.extend_from_slice(&bits.to_le_bytes());
            }
        }
        put32(&mut rec, bufs.len() as u32);
        for &(base, bytes) in &bufs {
            rec.extend_from_slice(&(bytes as u64).to_le_bytes());
            // SAFETY: a live buffer of this device (checked above), not being written now.
            rec.extend_from_slice(unsafe { std::slice::from_raw_parts(base as *const u8, bytes) });
        }
        let mut w = t.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(&rec).context("writing the launch trace")
    }
}

fn encode(a: &Arg) -> (i32, u64) {
    match *a {
        Arg::Ptr(p) => (KIND_PTR, p),
        Arg::I64(v) => (KIND_I64, v as u64),
        Arg::I32(v) => (KIND_I32, v as u32 as u64),
        Arg::F32(v) => (KIND_F32, v.to_bits() as u64),
    }
}

impl Launch for Emu {
    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if grid.1 > 65535 || grid.2 > 65535 {
            bail!("kernel {name}: grid {grid:?} exceeds the y/z limit of 65535 blocks");
        }
        for (i, a) in args.iter().enumerate() {
            if let Arg::Ptr(p) = *a {
                if self.buffer_of(p).is_none() {
                    bail!(
                        "kernel {name}: argument {i} ({p:#x}) points into no buffer of this device"
                    );
                }
            }
        }
        self.record(name, grid, block, args)?;
        let c_name = CString::new(name).context("kernel name")?;
        let c_args: Vec<EmuArg> = args
            .iter()
            .map(|a| {
                let (kind, bits) = encode(a);
                EmuArg { kind, pad: 0, bits }
            })
            .collect();
        let g = [grid.0, grid.1, grid.2];
        let b = [block, 1, 1];
        let mut err = vec![0u8; 512];
        let flags = if self.reverse { FLAG_REVERSE } else { 0 };
        // SAFETY: the pointers point into live buffers (checked above; the launch wrappers check
        // the sizes), the table checks the argument kinds against the kernel's parameters.
        let rc = unsafe {
            el_emu_launch(
                c_name.as_ptr(),
                g.as_ptr(),
                b.as_ptr(),
                c_args.as_ptr(),
                c_args.len() as c_int,
                flags,
                err.as_mut_ptr() as *mut c_char,
                err.len(),
            )
        };
        if rc != 0 {
            let msg = CStr::from_bytes_until_nul(&err)
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_default();
            bail!("emulated launch: {msg}");
        }
        Ok(())
    }
}

impl CudaDevice for Emu {
    type Buf = EmuBuf;

    fn device_name(&self) -> String {
        "the CUDA emulator (CPU)".into()
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<EmuBuf> {
        let bytes = bytes.max(1);
        let layout = Layout::from_size_align(bytes, 64).context("buffer size")?;
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("allocating {bytes} bytes of emulated device memory");
        }
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr as u64, bytes);
        Ok(EmuBuf {
            ptr,
            bytes,
            layout,
            registry: self.registry.clone(),
        })
    }

    fn upload_bytes(&self, bytes: &[u8]) -> Result<EmuBuf> {
        let b = self.alloc_zeroed(bytes.len())?;
        // SAFETY: b holds at least bytes.len() bytes and is not shared yet.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.ptr, bytes.len()) };
        Ok(b)
    }

    fn download_bytes(&self, buf: &EmuBuf, out: &mut [u8]) -> Result<()> {
        if out.len() > buf.bytes {
            bail!(
                "downloading {} bytes of a {}-byte buffer",
                out.len(),
                buf.bytes
            );
        }
        // SAFETY: launches are synchronous, so nothing writes the buffer now.
        unsafe { std::ptr::copy_nonoverlapping(buf.ptr, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn ptr(&self, buf: &EmuBuf) -> DevPtr {
        DevPtr {
            addr: buf.ptr as u64,
            bytes: buf.bytes,
        }
    }

    fn bind(&self) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        // Host memory: no device limit to check against.
        Ok((usize::MAX / 2, usize::MAX / 2))
    }
}
