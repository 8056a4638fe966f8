//! The interface every CUDA device implements, the real GPU ([`super::Gpu`]) and the CPU
//! emulator ([`super::emu::Emu`]): launching a kernel by name with a list of arguments, and
//! device memory as untyped byte buffers. The launch wrappers (`super::kernels`), the forward
//! pass (`super::forward`) and the kernel tests are written once against it.

use anyhow::{bail, Result};

/// A kernel argument: device pointers go as 64-bit addresses.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
}

/// A device address and how many bytes from it belong to the buffer, for bounds checks.
#[derive(Clone, Copy, Debug)]
pub struct DevPtr {
    pub addr: u64,
    pub bytes: usize,
}

impl DevPtr {
    /// The part of the buffer from `offset` bytes on.
    pub fn offset(self, offset: usize) -> Result<DevPtr> {
        if offset > self.bytes {
            bail!(
                "device buffer offset {offset} past its {} bytes",
                self.bytes
            );
        }
        Ok(DevPtr {
            addr: self.addr + offset as u64,
            bytes: self.bytes - offset,
        })
    }

    /// Fails unless at least `bytes` bytes are there.
    pub fn need(self, bytes: usize, what: &str) -> Result<u64> {
        if bytes > self.bytes {
            bail!(
                "{what}: needs {bytes} bytes of a {}-byte device buffer",
                self.bytes
            );
        }
        Ok(self.addr)
    }
}

/// Launching kernels by name; what `super::kernels` needs.
pub trait Launch {
    /// Launches kernel `name`: `grid` blocks of `block` threads, arguments in the kernel's
    /// parameter order. An empty grid launches nothing.
    fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()>;
}

/// Element types that go to and from device memory as their bytes.
pub trait Plain: Copy + Default + 'static {}
impl Plain for u8 {}
impl Plain for u16 {}
impl Plain for i32 {}
impl Plain for u32 {}
impl Plain for i64 {}
impl Plain for f32 {}

fn as_bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: Plain types are integers and floats: no padding, every byte initialized.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// A device with memory: buffers, copies, and the launches that use them.
pub trait CudaDevice: Launch {
    /// A device buffer (freed on drop).
    type Buf;

    /// The device's name, for logs and errors.
    fn device_name(&self) -> String;
    /// A zeroed buffer of `bytes` bytes (at least one).
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Buf>;
    /// A buffer holding `bytes`.
    fn upload_bytes(&self, bytes: &[u8]) -> Result<Self::Buf>;
    /// The first `out.len()` bytes of `buf`, after every launch queued before has run.
    fn download_bytes(&self, buf: &Self::Buf, out: &mut [u8]) -> Result<()>;
    /// The address and size of `buf`.
    fn ptr(&self, buf: &Self::Buf) -> DevPtr;
    /// Makes the device current on the calling thread.
    fn bind(&self) -> Result<()>;
    /// Waits until every launch queued has run.
    fn synchronize(&self) -> Result<()>;
    /// Free and total device memory in bytes.
    fn mem_info(&self) -> Result<(usize, usize)>;

    /// A device copy of `host`.
    fn upload<T: Plain>(&self, host: &[T]) -> Result<Self::Buf> {
        if host.is_empty() {
            bail!("uploading an empty buffer");
        }
        self.upload_bytes(as_bytes(host))
    }

    /// A zeroed buffer of `len` elements of `T`.
    fn zeros<T: Plain>(&self, len: usize) -> Result<Self::Buf> {
        self.alloc_zeroed(len.max(1) * std::mem::size_of::<T>())
    }

    /// The first `len` elements of `buf` as `T`s.
    fn download<T: Plain>(&self, buf: &Self::Buf, len: usize) -> Result<Vec<T>> {
        let bytes = len * std::mem::size_of::<T>();
        let have = self.ptr(buf).bytes;
        if bytes > have {
            bail!("downloading {bytes} bytes of a {have}-byte device buffer");
        }
        let mut host = vec![T::default(); len];
        // SAFETY: as in as_bytes; every bit pattern is a valid Plain value.
        let out = unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr() as *mut u8, bytes) };
        self.download_bytes(buf, out)?;
        Ok(host)
    }
}
