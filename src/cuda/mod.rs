//! The CUDA backend (cargo feature `cuda`): the same forward pass over the same [`Batch`] as the
//! CPU path, with the weights uploaded once as stored (quantized) and the paged KV pool in device
//! memory. cudarc loads libcuda and libnvrtc at run time, so a binary built with the feature
//! starts anywhere; [`probe`] says whether a GPU can be used before anything touches the driver.
//!
//! - `nvrtc`: the embedded kernel sources (`csrc/cuda/`) and their compilation.
//! - `launch`: what every device offers: launches by name, byte buffers.
//! - `device`: finding a GPU without a panic, the context, the stream, launching.
//! - `emu`: the same kernels compiled for the CPU (csrc/cuda/emu/), a device for tests.
//! - `kernels`: launch wrappers that check every buffer against the kernel's shapes.
//! - `forward`: [`CudaModel`], the weights and KV pool on a device (the GPU, or the emulator in
//!   tests) and the forward pass.
//!
//! [`Batch`]: crate::model::Batch

pub mod device;
pub mod emu;
pub mod forward;
pub mod kernels;
pub mod launch;
pub mod nvrtc;

pub use device::{probe, Gpu};
pub use emu::Emu;
pub use forward::CudaModel;
pub use launch::{CudaDevice, Launch};
