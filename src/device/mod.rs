//! Where the forward pass runs. [`Device`] is what `--device` asks for; [`Executor`] is a model's
//! weights loaded on one backend with its KV pool: the CPU (`crate::model::Cpu`: most weights in
//! the mmap, the paged KV cache in host memory), a GPU (`crate::cuda`, feature `cuda`: the
//! weights uploaded, the KV pool in device memory), or the CUDA kernels' CPU emulator (tests).
//! Every backend runs the same layer loop (`crate::model::forward`). The engine thread and [`SequenceRunner`] hold an executor and
//! call [`Executor::forward`] with the same [`Batch`] either way; the scheduler and block manager
//! never know which.
//!
//! [`SequenceRunner`]: crate::scoring::runner::SequenceRunner

use std::io::IsTerminal;

use anyhow::{bail, Result};

use crate::kernels::{kv_type_name, KvTypes, CUDA_KV_TYPES};
use crate::model::kv_cache::BlockId;
use crate::model::state_pool::StateSlot;
use crate::model::{Batch, Cpu, Loaded, Model, StepOutput};

/// Where a model runs and what its KV pool holds: `--device` with `--cache-type-k` and
/// `--cache-type-v`. A bare [`Device`] is that device with an f16 pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub device: Device,
    pub kv_types: KvTypes,
}

impl Placement {
    /// The placement to run on, its device `Cpu` or `Cuda`: the CUDA backend keeps an f16, q8_0
    /// or q4_0 KV cache (`CUDA_KV_TYPES`), so another cache type with `--device cuda` is refused
    /// in one line (before any GPU is probed), and with `auto` runs on the CPU.
    pub fn resolve(self) -> Result<Placement> {
        let on_cuda = [self.kv_types.k, self.kv_types.v]
            .iter()
            .all(|t| CUDA_KV_TYPES.contains(t));
        let device = match (self.device, on_cuda) {
            (Device::Cuda, false) => bail!(
                "--cache-type-k {} --cache-type-v {}: the CUDA backend keeps f16, q8_0 or q4_0 \
                 KV caches; use one of those on CUDA or --device cpu",
                kv_type_name(self.kv_types.k),
                kv_type_name(self.kv_types.v)
            ),
            (Device::Auto, false) => Device::Cpu,
            (d, _) => d.resolve()?,
        };
        Ok(Placement { device, ..self })
    }
}

impl From<Device> for Placement {
    fn from(device: Device) -> Placement {
        Placement {
            device,
            kv_types: KvTypes::F16,
        }
    }
}

/// The `--device` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Device {
    /// CUDA when this binary has it and a GPU is usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl Device {
    /// The device to run on: `Cpu` or `Cuda`. `Cuda` fails with the reason when it cannot be
    /// used; `Auto` falls back to the CPU, saying why in one line on a terminal's stderr when
    /// this binary has CUDA (in a pipe it stays quiet, as every log does; `serve` and `bench`
    /// name the device in their KV cache line).
    pub fn resolve(self) -> Result<Device> {
        match self {
            Device::Cpu => Ok(Device::Cpu),
            Device::Cuda => {
                cuda_probe()?;
                Ok(Device::Cuda)
            }
            Device::Auto => {
                if !cfg!(feature = "cuda") {
                    return Ok(Device::Cpu);
                }
                match cuda_probe() {
                    Ok(()) => Ok(Device::Cuda),
                    Err(e) => {
                        if std::io::stderr().is_terminal() {
                            eprintln!("{e:#}; running on the CPU");
                        }
                        Ok(Device::Cpu)
                    }
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_probe() -> Result<()> {
    crate::cuda::probe().map(|_| ())
}

#[cfg(not(feature = "cuda"))]
fn cuda_probe() -> Result<()> {
    bail!("--device cuda: built without CUDA support (rebuild with --features cuda)")
}

/// The state that runs forward steps on one device.
pub enum Executor {
    Cpu(Box<Loaded<Cpu>>),
    #[cfg(feature = "cuda")]
    Cuda(Box<Loaded<crate::cuda::CudaBackend<crate::cuda::Gpu>>>),
    /// The CUDA backend on the CPU emulator of its kernels: for tests that drive the engine
    /// through the CUDA code without a GPU.
    #[cfg(feature = "cuda")]
    CudaEmulated(Box<Loaded<crate::cuda::CudaBackend<crate::cuda::Emu>>>),
}

impl Executor {
    /// A CPU executor: an f16 KV pool of `num_blocks` blocks of `block_size` tokens.
    pub fn cpu(model: &Model, block_size: usize, num_blocks: usize) -> Executor {
        Executor::Cpu(Box::new(model.on_cpu(KvTypes::F16, block_size, num_blocks)))
    }

    /// An executor on the placement's device (resolved first) with a KV pool of `num_blocks`
    /// blocks of `block_size` tokens of its cache types; on a GPU this uploads the weights.
    /// Cache types the model's head size cannot hold are refused in one line, and so is a cache
    /// type the CUDA kernels do not keep, on CUDA ([`Placement::resolve`]).
    pub fn new(
        model: &Model,
        placement: impl Into<Placement>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Executor> {
        let placement = placement.into();
        let kv_types = placement.kv_types;
        if block_size == 0 || num_blocks == 0 {
            bail!("the KV pool needs at least one block of at least one token");
        }
        kv_types
            .check(model.config.head_dim)
            .map_err(anyhow::Error::msg)?;
        match placement.resolve()?.device {
            Device::Cuda => Self::cuda(model, kv_types, block_size, num_blocks),
            _ => Ok(Executor::Cpu(Box::new(
                model.on_cpu(kv_types, block_size, num_blocks),
            ))),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        model: &Model,
        kv_types: KvTypes,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Executor> {
        use anyhow::Context;
        let gpu = crate::cuda::Gpu::new()?;
        let name = gpu.name.clone();
        let m = crate::cuda::load(gpu, model, kv_types, block_size, num_blocks)
            .with_context(|| format!("loading the model onto {name}"))?;
        Ok(Executor::Cuda(Box::new(m)))
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_: &Model, _: KvTypes, _: usize, _: usize) -> Result<Executor> {
        cuda_probe()?;
        bail!("CUDA support is not built in")
    }

    /// The CUDA backend on the emulator of its kernels (`crate::cuda::Emu`), for tests: an f16
    /// KV pool.
    #[cfg(feature = "cuda")]
    pub fn cuda_emulated(
        model: &Model,
        emu: crate::cuda::Emu,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Executor> {
        Self::cuda_emulated_as(model, emu, KvTypes::F16, block_size, num_blocks)
    }

    /// [`Executor::cuda_emulated`] with a KV pool of `kv_types` (refused as on a GPU).
    #[cfg(feature = "cuda")]
    pub fn cuda_emulated_as(
        model: &Model,
        emu: crate::cuda::Emu,
        kv_types: KvTypes,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Executor> {
        let m = crate::cuda::load(emu, model, kv_types, block_size, num_blocks)?;
        Ok(Executor::CudaEmulated(Box::new(m)))
    }

    /// Which device this executor runs on (`Cpu` or `Cuda`).
    pub fn device(&self) -> Device {
        match self {
            Executor::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) | Executor::CudaEmulated(_) => Device::Cuda,
        }
    }

    /// A line for logs: the device and, on a GPU, its name and how its kernels were loaded.
    pub fn describe(&self) -> String {
        match self {
            Executor::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => {
                let gpu = m.backend.device();
                format!(
                    "cuda: {} (compute {}.{}, kernels: {})",
                    gpu.name, gpu.compute_capability.0, gpu.compute_capability.1, gpu.kernels_from
                )
            }
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(_) => "cuda: the CPU emulator of the CUDA kernels".into(),
        }
    }

    /// What the KV pool holds keys and values in.
    pub fn kv_types(&self) -> KvTypes {
        match self {
            Executor::Cpu(m) => m.backend.kv().types,
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.backend.kv_types(),
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(m) => m.backend.kv_types(),
        }
    }

    pub fn block_size(&self) -> usize {
        match self {
            Executor::Cpu(m) => m.backend.block_size(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.backend.block_size(),
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(m) => m.backend.block_size(),
        }
    }

    /// Runs one step of `model` over `batch`; returns the logits of `batch.logits_rows`,
    /// [logits_rows.len()][vocab_size].
    pub fn forward(&mut self, model: &Model, batch: &Batch) -> Result<Vec<f32>> {
        let c = &model.config;
        match self {
            // This thread takes part in each kernel's parallel split (`kernels::pool`).
            Executor::Cpu(m) => m.forward(c, batch),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.forward(c, batch),
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(m) => m.forward(c, batch),
        }
    }

    /// [`Executor::forward`], also returning the embeddings of `batch.embd_rows`.
    pub fn forward_rows(&mut self, model: &Model, batch: &Batch) -> Result<StepOutput> {
        let c = &model.config;
        match self {
            Executor::Cpu(m) => m.forward_rows(c, batch),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.forward_rows(c, batch),
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(m) => m.forward_rows(c, batch),
        }
    }

    /// Copies KV block `src` onto `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        use crate::model::Backend;
        match self {
            Executor::Cpu(m) => m.backend.copy_block(src, dst),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.backend.copy_block(src, dst),
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(m) => m.backend.copy_block(src, dst),
        }
    }

    /// A recurrent state pool of `num_slots` slots (`crate::model::state_pool`) for a model with
    /// recurrent layers, replacing the one before; nothing for a model without (0 slots).
    pub fn set_state_slots(&mut self, model: &Model, num_slots: usize) -> Result<()> {
        match self {
            Executor::Cpu(m) => {
                m.backend.set_state_slots(&model.config, num_slots);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) | Executor::CudaEmulated(_) => match model.config.is_recurrent() {
                true => bail!("the CUDA backend has no recurrent state pool"),
                false => Ok(()),
            },
        }
    }

    /// Copies state slot `src` onto `dst` (a forked sequence of a model with recurrent layers).
    pub fn copy_state(&mut self, src: StateSlot, dst: StateSlot) -> Result<()> {
        use crate::model::Backend;
        match self {
            Executor::Cpu(m) => m.backend.copy_state(src, dst),
            #[cfg(feature = "cuda")]
            Executor::Cuda(m) => m.backend.copy_state(src, dst),
            #[cfg(feature = "cuda")]
            Executor::CudaEmulated(m) => m.backend.copy_state(src, dst),
        }
    }

    /// Block `id`'s KV bytes (see `KvCache::read_block`), for the disk tier; None on devices
    /// whose pool the disk tier does not reach.
    pub fn read_block(&self, id: BlockId) -> Option<Vec<u8>> {
        match self {
            Executor::Cpu(m) => Some(m.backend.kv().read_block(id)),
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) | Executor::CudaEmulated(_) => None,
        }
    }

    /// State slot `slot`'s bytes (`StatePool::read_slot`), for the disk tier; None on devices
    /// whose state the disk tier does not reach, or outside the pool.
    pub fn read_state(&self, slot: StateSlot) -> Option<Vec<u8>> {
        match self {
            Executor::Cpu(m) => m.backend.states().read_slot(slot),
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) | Executor::CudaEmulated(_) => None,
        }
    }

    /// Fills state slot `slot` from bytes `read_state` gave: a state that has seen `covers`
    /// tokens.
    pub fn write_state(&mut self, slot: StateSlot, bytes: &[u8], covers: usize) -> Result<()> {
        match self {
            Executor::Cpu(m) => m.backend.states_mut().write_slot(slot, bytes, covers),
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) | Executor::CudaEmulated(_) => {
                bail!("the disk tier does not reach the GPU's state pool")
            }
        }
    }

    /// Fills block `id` from bytes `read_block` gave.
    pub fn write_block(&mut self, id: BlockId, bytes: &[u8]) -> Result<()> {
        match self {
            Executor::Cpu(m) => m.backend.kv_mut().write_block(id, bytes),
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) | Executor::CudaEmulated(_) => {
                bail!("the disk tier does not reach the GPU's KV pool")
            }
        }
    }
}
