//! The CUDA backend (cargo feature `cuda`): the operations of `crate::model::Backend` as CUDA
//! launches, so the model's one forward pass runs over the same [`Batch`] as on the CPU, with the
//! weights uploaded once as stored (quantized) and the paged KV pool in device memory. No model
//! description lives here: the layer loop and the weights' layout are `crate::model`'s.
//! cudarc loads libcuda and libnvrtc at run time, so a binary built with the feature starts
//! anywhere; [`probe`] says whether a GPU can be used before anything touches the driver.
//!
//! - `nvrtc`: the embedded kernel sources (`csrc/cuda/`) and their compilation.
//! - `launch`: what every device offers ([`CudaDevice`]): launches by name, byte buffers.
//! - `device`: finding a GPU without a panic, the context, the stream, launching.
//! - `profile`: per-kernel GPU times on a real GPU (`EDGE_LLM_CUDA_PROFILE=1`).
//! - `emu`: the same kernels compiled for the CPU (csrc/cuda/emu/), a device for tests.
//! - `kernels`: launch wrappers that check every buffer against the kernel's shapes.
//! - `kv_pool`: the paged KV pool on a device (f16, q8_0 or q4_0) and its key centers.
//! - `backend`: [`CudaBackend`], the weights, KV pool and scratch on a device (the GPU, or the
//!   emulator in tests), and [`load`] to put a model there.
//!
//! [`Batch`]: crate::model::Batch

pub mod backend;
pub mod device;
pub mod emu;
pub mod kernels;
pub mod kv_pool;
pub mod launch;
pub mod nvrtc;
pub mod profile;

pub use backend::{load, CudaBackend};
pub use device::{probe, Gpu};
pub use emu::Emu;
pub use launch::{CudaDevice, Launch};
