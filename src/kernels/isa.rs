//! Which instruction set the C kernels run (`el_isa_*` in `csrc/simd_dispatch.c`).
//!
//! Every kernel has a scalar reference; some have SIMD variants, and the C side picks the best
//! the CPU offers on first use. The choice is process-wide: `set_isa` changes it for every thread
//! at once, so it is for tests and benchmarks that compare variants (hold a lock across the calls
//! that must see one ISA). `current_isa` names what runs, for logs and reports.

use std::fmt;
use std::str::FromStr;

use super::bindings as ffi;
use super::tensor_type::TensorType;

/// A set of kernel variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The plain-C references, the truth the others are tested against.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// AArch64 NEON with the dot-product instructions (SDOT): the 32-element types' dot
    /// products and the interleaved products; the rest runs the references.
    Neon,
    /// x86-64 AVX2's kernels, with the interleaved products ([`matmul_x8`](super::matmul_x8))
    /// on AVX-512 VNNI (`vpdpbusd`; needs AVX-512 F, BW and VL too).
    Avx512Vnni,
}

impl Isa {
    /// Every variant this build knows, references first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Neon];

    /// The lower-case name used in logs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    fn id(self) -> i32 {
        (match self {
            Isa::Scalar => ffi::el_isa_EL_ISA_SCALAR,
            Isa::Avx2 => ffi::el_isa_EL_ISA_AVX2,
            Isa::Neon => ffi::el_isa_EL_ISA_NEON,
            Isa::Avx512Vnni => ffi::el_isa_EL_ISA_AVX512VNNI,
        }) as i32
    }

    fn from_id(id: i32) -> Option<Isa> {
        Isa::ALL.into_iter().find(|isa| isa.id() == id)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = String;

    fn from_str(s: &str) -> Result<Isa, String> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<_> = Isa::ALL.iter().map(|isa| isa.name()).collect();
                format!(
                    "unknown instruction set {s:?} (known: {})",
                    names.join(", ")
                )
            })
    }
}

/// `set_isa` asked for variants this CPU (or build) cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {0} kernels are not available on this CPU")]
pub struct IsaUnavailable(pub Isa);

/// The name of `isa` (as `Isa::name`).
pub fn isa_name(isa: Isa) -> &'static str {
    isa.name()
}

/// Whether this CPU and build can run `isa`.
pub fn isa_available(isa: Isa) -> bool {
    // SAFETY: a pure query of the CPU's features.
    unsafe { ffi::el_isa_available(isa.id()) == 1 }
}

/// The variants this machine can run, references first.
pub fn available_isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|&isa| isa_available(isa))
        .collect()
}

/// The variants the kernels run now: the best available unless `set_isa` chose another.
pub fn current_isa() -> Isa {
    // SAFETY: reads one atomic (detecting the CPU on first use).
    let id = unsafe { ffi::el_isa_get() };
    Isa::from_id(id).unwrap_or_else(|| panic!("el_isa_get returned unknown ISA {id}"))
}

/// The variant [`matmul_x8`](super::matmul_x8) runs for `t` now (the ISA whose interleaved
/// product `el_matmul_x8` calls: the scalar reference where the current ISA has none); `None` for
/// a type without an interleaved layout.
pub fn matmul_x8_isa(t: TensorType) -> Option<Isa> {
    // SAFETY: reads the current ISA and a type table.
    let id = unsafe { ffi::el_matmul_x8_isa(t.ggml_id() as i32) };
    if id < 0 {
        return None;
    }
    Some(Isa::from_id(id).unwrap_or_else(|| panic!("el_matmul_x8_isa returned unknown ISA {id}")))
}

/// Makes every kernel, on every thread, run `isa` from now on. Kernels already running finish on
/// the variant they started with.
pub fn set_isa(isa: Isa) -> Result<(), IsaUnavailable> {
    // SAFETY: stores one atomic; fails without effect when isa is unavailable.
    let status = unsafe { ffi::el_isa_set(isa.id()) };
    if status == ffi::el_status_EL_OK {
        Ok(())
    } else {
        Err(IsaUnavailable(isa))
    }
}
