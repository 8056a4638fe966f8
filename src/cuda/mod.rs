//! The CUDA backend (cargo feature `cuda`): the same forward pass over the same [`Batch`] as the
//! CPU path, with the weights uploaded once as stored (quantized) and the paged KV pool in device
//! memory. cudarc loads libcuda and libnvrtc at run time, so a binary built with the feature
//! starts anywhere; [`probe`] says whether a GPU can be used before anything touches the driver.
//!
//! - `nvrtc`: the embedded kernel sources (`csrc/cuda/`) and their compilation.
//!
//! [`Batch`]: crate::model::Batch

pub mod nvrtc;
