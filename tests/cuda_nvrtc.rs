//! CI without a GPU: every CUDA kernel program compiles through NVRTC, with no warning, to PTX for
//! compute_80 and compute_90 and to machine code for sm_80 and sm_90, and every kernel entry point
//! the backend loads is in the PTX. A kernel that does not compile fails here, not on a GPU.
//!
//! Needs libnvrtc: scripts/test.sh installs the PyPI wheel nvidia-cuda-nvrtc-cu12 into
//! .cuda-wheels/ and puts its lib/ on LD_LIBRARY_PATH. Without it the test fails (set
//! EDGE_LLM_SKIP_NVRTC=1 to skip it knowingly).
#![cfg(feature = "cuda")]

mod support;

use edge_llm::cuda::nvrtc;

/// Whether libnvrtc loads; when it does not, the test fails, under CI=true or not, unless
/// EDGE_LLM_SKIP_NVRTC is set.
fn nvrtc_or_skip() -> bool {
    if nvrtc::available() {
        return true;
    }
    let required = std::env::var_os("EDGE_LLM_SKIP_NVRTC").is_none();
    support::skip_or_fail_if(
        required.then_some("EDGE_LLM_SKIP_NVRTC is not set"),
        "libnvrtc is not loadable: run scripts/test.sh (it installs nvidia-cuda-nvrtc-cu12) or set LD_LIBRARY_PATH",
    );
    false
}

/// The PTX entry points (`.entry name(`) of a module.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            l.trim_start()
                .strip_prefix(".visible .entry ")
                .or_else(|| l.trim_start().strip_prefix(".entry "))
        })
        .map(|rest| rest.split('(').next().unwrap_or("").trim().to_string())
        .collect()
}

#[test]
fn every_kernel_compiles_for_every_target_without_warnings() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = nvrtc::version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    let mut failures = Vec::new();
    for program in nvrtc::PROGRAMS {
        for arch in ["compute_80", "compute_90", "sm_80", "sm_90"] {
            // Any line in NVRTC's log (a warning: an unused variable, a narrowing) fails too.
            match nvrtc::compile(program, arch, &[]) {
                Err(e) => failures.push(format!("{e:#}")),
                Ok(c) => {
                    if !c.log.trim().is_empty() {
                        failures.push(format!("{program} ({arch}) log:\n{}", c.log));
                    }
                    if arch.starts_with("sm_") && c.cubin.as_ref().is_none_or(|b| b.len() < 64) {
                        failures.push(format!("{program} ({arch}): no machine code"));
                    }
                    let entries = ptx_entries(&c.ptx);
                    for name in nvrtc::entry_points(program) {
                        if !entries.contains(&name) {
                            failures.push(format!(
                                "{program} ({arch}): entry point {name} missing from the PTX"
                            ));
                        }
                    }
                    eprintln!(
                        "{program} {arch}: {} entry points, {} bytes of PTX",
                        entries.len(),
                        c.ptx.len()
                    );
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_source_file_is_compiled_and_every_kernel_listed() {
    // Every .cu in csrc/cuda is a program, every .cuh is embedded, and the PTX holds no entry
    // point the backend does not know (a kernel nobody launches is dead or forgotten).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc/cuda");
    // Files only: csrc/cuda/emu/ is the CPU emulator's shim, not kernel source.
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    // Files outside csrc/cuda that the kernels include by a relative name (the C kernels' IQ
    // codebooks, "../el_iq_tables.h") are embedded too, and exist.
    let (outside, inside): (Vec<&str>, Vec<&str>) = nvrtc::SOURCES
        .iter()
        .map(|(n, _)| *n)
        .partition(|n| n.starts_with("../"));
    for name in outside {
        assert!(
            dir.join(name).is_file(),
            "{name}: no such file beside csrc/cuda"
        );
    }
    let mut embedded: Vec<String> = inside.iter().map(|n| n.to_string()).collect();
    embedded.sort();
    assert_eq!(on_disk, embedded, "csrc/cuda and nvrtc::SOURCES differ");
    for name in &on_disk {
        if name.ends_with(".cu") {
            assert!(
                nvrtc::PROGRAMS.contains(&name.as_str()),
                "{name} is not in nvrtc::PROGRAMS"
            );
        }
    }
    if !nvrtc_or_skip() {
        return;
    }
    for program in nvrtc::PROGRAMS {
        let c = nvrtc::compile(program, "compute_80", &[]).unwrap();
        let mut entries = ptx_entries(&c.ptx);
        entries.sort();
        let mut listed = nvrtc::entry_points(program);
        listed.sort();
        assert_eq!(
            entries, listed,
            "{program}: PTX entry points and nvrtc::entry_points differ"
        );
    }
}

#[test]
fn includes_resolve_to_one_translation_unit() {
    for program in nvrtc::PROGRAMS {
        let tu = nvrtc::translation_unit(program).unwrap();
        assert!(!tu.contains("#include \""), "{program}: unresolved include");
        assert_eq!(tu.matches("#define EL_CUDA_COMMON_CUH").count(), 1);
    }
}
