//! The CUDA kernel sources (embedded in the binary) and their compilation through NVRTC, which
//! cudarc loads at run time (libnvrtc). Used at start-up when the build had no `nvcc` to compile
//! them to PTX ahead of time (build.rs), and by `tests/cuda_nvrtc.rs`, which compiles every
//! program for each target architecture on machines without a GPU.
//!
//! The kernels include no CUDA header, so no include path is needed: the only `#include`s are of
//! each other and of two C headers they share with the CPU kernels (csrc/el_types.h, the tensor
//! types and block sizes; csrc/el_iq_tables.h, the IQ codebooks), resolved here from the
//! embedded text.

use anyhow::{bail, Context, Result};
use std::ffi::{CStr, CString};

/// Every kernel source file, by name, as embedded at build time.
pub const SOURCES: &[(&str, &str)] = &[
    (
        "el_cuda_common.cuh",
        include_str!("../../csrc/cuda/el_cuda_common.cuh"),
    ),
    ("el_iq.cuh", include_str!("../../csrc/cuda/el_iq.cuh")),
    (
        "el_iq_tables.cuh",
        include_str!("../../csrc/cuda/el_iq_tables.cuh"),
    ),
    // The tensor types and block sizes the C kernels and Rust share, which el_cuda_common.cuh
    // includes by this relative name.
    ("../el_types.h", include_str!("../../csrc/el_types.h")),
    // The C kernels' IQ codebooks, which el_iq_tables.cuh includes by this relative name.
    (
        "../el_iq_tables.h",
        include_str!("../../csrc/el_iq_tables.h"),
    ),
    ("el_quants.cu", include_str!("../../csrc/cuda/el_quants.cu")),
    ("el_ops.cu", include_str!("../../csrc/cuda/el_ops.cu")),
];

/// The programs (translation units), each loaded as one module.
pub const PROGRAMS: &[&str] = &["el_quants.cu", "el_ops.cu"];

/// Options every compilation uses. `--fmad=false` keeps a * b + c rounding twice, as the C
/// references do (-ffp-contract=off); divisions and square roots stay IEEE (NVRTC's default).
pub const OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// Kernel entry points of each program, all loaded at start-up; the NVRTC test checks that each
/// appears in the PTX.
pub fn entry_points(program: &str) -> Vec<String> {
    const QUANT: &[&str] = &[
        "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl",
        "mxfp4", "iq4_xs", "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m",
    ];
    const FLOAT: &[&str] = &["f32", "f16", "bf16"];
    match program {
        "el_quants.cu" => {
            let mut v: Vec<String> = ["q8_0", "q8_1", "q8_K", "f16", "bf16"]
                .iter()
                .map(|t| format!("el_cuda_quantize_{t}"))
                .collect();
            v.push("el_cuda_kv_write_q".into());
            for t in QUANT {
                v.push(format!("el_cuda_mmv_{t}"));
                v.push(format!("el_cuda_mm_{t}"));
                v.push(format!("el_cuda_get_rows_{t}"));
            }
            for t in FLOAT {
                v.push(format!("el_cuda_mm_{t}"));
                v.push(format!("el_cuda_get_rows_{t}"));
            }
            v
        }
        "el_ops.cu" => [
            "el_cuda_rms_norm",
            "el_cuda_rope",
            "el_cuda_rope_ext",
            "el_cuda_swiglu",
            "el_cuda_swiglu_oai",
            "el_cuda_geglu",
            "el_cuda_kv_write",
            "el_cuda_paged_attention",
            "el_cuda_hadamard",
            "el_cuda_add",
            "el_cuda_add_bias",
            "el_cuda_scale",
            "el_cuda_softcap",
            "el_cuda_gather_rows",
            "el_cuda_scatter_rows",
            "el_cuda_weighted_sum",
            "el_cuda_copy_block",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        _ => Vec::new(),
    }
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// `program`'s source with its `#include "..."` of the other embedded files spliced in (each
/// file once: they carry include guards, but NVRTC never sees a file name to guard against).
pub fn translation_unit(program: &str) -> Result<String> {
    fn splice(name: &str, out: &mut String, seen: &mut Vec<String>) -> Result<()> {
        let (_, text) = SOURCES
            .iter()
            .find(|(n, _)| *n == name)
            .with_context(|| format!("no embedded kernel source {name}"))?;
        if seen.iter().any(|s| s == name) {
            return Ok(());
        }
        seen.push(name.to_string());
        for line in text.lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix("#include") {
                let inc = rest.trim().trim_matches('"');
                if rest.trim().starts_with('"') {
                    splice(inc, out, seen)?;
                    continue;
                }
                // System headers only in the nvcc branch (`#ifndef __CUDACC_RTC__`); NVRTC never
                // sees them, and any other would fail its compile (no include path is given).
                out.push_str(line);
                out.push('\n');
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        Ok(())
    }
    let mut out = String::new();
    splice(program, &mut out, &mut Vec::new())?;
    Ok(out)
}

/// What one NVRTC compilation produced.
pub struct Compiled {
    /// The PTX text (for a `compute_XY` target, or alongside the cubin for `sm_XY`).
    pub ptx: String,
    /// Machine code, for an `sm_XY` target.
    pub cubin: Option<Vec<u8>>,
    /// NVRTC's log: warnings, even when the compilation succeeded.
    pub log: String,
}

/// Compiles `program` for `arch` ("compute_80" gives PTX, "sm_80" PTX and a cubin), with
/// [`OPTIONS`] and `extra` options. An error carries NVRTC's log.
pub fn compile(program: &str, arch: &str, extra: &[&str]) -> Result<Compiled> {
    use cudarc::nvrtc::{result, sys};
    if !available() {
        bail!("libnvrtc is not loadable (install the CUDA toolkit, or the PyPI wheel nvidia-cuda-nvrtc-cu12 and put its lib/ on LD_LIBRARY_PATH)");
    }
    let src =
        CString::new(translation_unit(program)?).context("kernel source contains a NUL byte")?;
    let name = CString::new(program).expect("program names have no NUL");
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| anyhow::anyhow!("nvrtcCreateProgram({program}): {e:?}"))?;
    let mut options: Vec<String> = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|s| s.to_string()));
    options.extend(extra.iter().map(|s| s.to_string()));
    // SAFETY: prog was created above and is destroyed once, at the end.
    let out = unsafe {
        let status = result::compile_program(prog, &options);
        let log = result::get_program_log(prog)
            .map(|l| c_text(&l))
            .unwrap_or_default();
        let out = match status {
            Err(e) => Err(anyhow::anyhow!(
                "NVRTC failed on {program} for {arch} ({e:?}), options {options:?}:\n{log}"
            )),
            Ok(()) => {
                let ptx = result::get_ptx(prog)
                    .map(|p| c_text(&p))
                    .map_err(|e| anyhow::anyhow!("nvrtcGetPTX: {e:?}"));
                let cubin = if arch.starts_with("sm_") {
                    let mut size = 0usize;
                    let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                    let mut bin = vec![0u8; size];
                    let r2 = if r == sys::nvrtcResult::NVRTC_SUCCESS {
                        sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr() as *mut _)
                    } else {
                        r
                    };
                    if r2 != sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(anyhow::anyhow!("nvrtcGetCUBIN({program}, {arch}): {r2:?}"))
                    } else {
                        Ok(Some(bin))
                    }
                } else {
                    Ok(None)
                };
                match (ptx, cubin) {
                    (Ok(ptx), Ok(cubin)) => Ok(Compiled { ptx, cubin, log }),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// NVRTC's version, e.g. (12, 9).
pub fn version() -> Result<(i32, i32)> {
    if !available() {
        bail!("libnvrtc is not loadable");
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        bail!("nvrtcVersion: {r:?}");
    }
    Ok((major, minor))
}

/// A NUL-terminated C buffer as text.
fn c_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}
