//! Compiles the C kernels in `csrc/` with `cc` (always optimised, even in debug builds) and,
//! with the `regen-bindings` feature, regenerates `src/kernels/bindings.rs` from
//! `csrc/edge_kernels.h` (and `csrc/el_types.h`, which it includes) with bindgen. The checked-in
//! bindings carry a hash of each header they were made from; `tests/bindings_drift.rs` fails when
//! either changes without them.
//!
//! With the `cuda` feature and `nvcc` on PATH (or in EDGE_LLM_NVCC), it also compiles the CUDA
//! kernels in `csrc/cuda/` to PTX for compute_80 and sets `cfg(edge_llm_prebuilt_ptx)`; without
//! nvcc the binary compiles the embedded sources with NVRTC at start-up instead. Without the
//! feature nothing CUDA is built or linked. With it, the same kernels are also compiled for the
//! CPU with g++ (`csrc/cuda/emu/`, the emulator behind `cuda::Emu`), which needs no CUDA at all.

use std::path::Path;

const HEADER: &str = "csrc/edge_kernels.h";
/// Every header the bindings come from: HEADER and what it includes from csrc/. Each one's hash
/// is recorded in the bindings (the same list is in tests/bindings_drift.rs).
const HEADERS: &[&str] = &["csrc/edge_kernels.h", "csrc/el_types.h"];
const BINDINGS: &str = "src/kernels/bindings.rs";

/// FNV-1a 64 over the header bytes, with `\r` dropped so a checkout's line endings don't matter.
/// The same function lives in tests/bindings_drift.rs.
fn header_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes.iter().filter(|&&b| b != b'\r') {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=build.rs");

    let mut sources: Vec<_> = std::fs::read_dir("csrc")
        .expect("csrc/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();

    let mut build = cc::Build::new();
    build
        .files(&sources)
        .include("csrc")
        .opt_level(3)
        .debug(false)
        .flag_if_supported("-std=c11")
        .flag_if_supported("-fno-math-errno")
        // No a*b+c -> fma contraction: the SIMD kernels reproduce the scalar references' float
        // operations one for one, which needs both compiled as written (GCC's default in ISO C
        // mode, not clang's).
        .flag_if_supported("-ffp-contract=off")
        .warnings(true);
    build.compile("edge_kernels");

    cuda_ptx();
    cuda_emulator();

    #[cfg(feature = "regen-bindings")]
    regen_bindings();
    let _ = Path::new(BINDINGS);
}

/// PTX of every `csrc/cuda/*.cu` into OUT_DIR with nvcc, when the `cuda` feature is on and nvcc
/// runs. The options match src/cuda/nvrtc.rs (OPTIONS): no fused multiply-add, C++17.
fn cuda_ptx() {
    println!("cargo::rustc-check-cfg=cfg(edge_llm_prebuilt_ptx)");
    println!("cargo:rerun-if-env-changed=EDGE_LLM_NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = std::env::var("EDGE_LLM_NVCC").unwrap_or_else(|_| "nvcc".into());
    let found = std::process::Command::new(&nvcc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        return; // NVRTC at start-up
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let mut programs: Vec<_> = std::fs::read_dir("csrc/cuda")
        .expect("csrc/cuda exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    programs.sort();
    for src in &programs {
        let stem = src
            .file_stem()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let out = std::process::Command::new(&nvcc)
            .args([
                "--ptx",
                "-arch=compute_80",
                "--fmad=false",
                "-std=c++17",
                "-O3",
                "-Icsrc/cuda",
                "-o",
            ])
            .arg(&ptx)
            .arg(src)
            .output()
            .expect("run nvcc");
        if !out.status.success() {
            panic!(
                "nvcc failed on {}:\n{}",
                src.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    println!("cargo:rustc-cfg=edge_llm_prebuilt_ptx");
}

/// The CUDA kernels compiled for the CPU (`csrc/cuda/emu/`), with the `cuda` feature. The flags
/// match NVRTC's: no contraction of a * b + c (--fmad=false); no strict aliasing (the kernels read
/// block fields through pointer casts). tests/cuda_kernels.rs compiles the same sources again
/// with AddressSanitizer (EMU_FLAGS there).
fn cuda_emulator() {
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    cc::Build::new()
        .cpp(true)
        .files([
            "csrc/cuda/emu/el_cuda_emu.cpp",
            "csrc/cuda/emu/el_emu_kernels.cpp",
        ])
        .include("csrc/cuda")
        .opt_level(2)
        .debug(false)
        .flag("-std=c++17")
        .flag("-ffp-contract=off")
        .flag("-fno-strict-aliasing")
        .flag_if_supported("-Wno-unknown-pragmas")
        .warnings(true)
        .compile("el_cuda_emu");
}

#[cfg(feature = "regen-bindings")]
fn regen_bindings() {
    let bindings = bindgen::Builder::default()
        .header(HEADER)
        .allowlist_function("el_.*")
        .allowlist_type("el_.*")
        .allowlist_var("EL_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(false)
        .generate()
        .expect("bindgen failed on csrc/edge_kernels.h");
    let mut hashes = String::new();
    for path in HEADERS {
        let bytes = std::fs::read(path).expect("read header");
        let name = Path::new(path)
            .file_name()
            .expect("file name")
            .to_string_lossy();
        hashes.push_str(&format!(
            "// {name} fnv1a64: {:016x}\n",
            header_hash(&bytes)
        ));
    }
    let text = format!(
        "//! FFI declarations generated by bindgen from csrc/edge_kernels.h; do not edit.\n\
         //! Regenerate with `cargo build --features regen-bindings`.\n\
         {hashes}\n{bindings}"
    );
    std::fs::write(BINDINGS, text).expect("write bindings");
}

#[cfg(not(feature = "regen-bindings"))]
#[allow(dead_code)]
fn unused() {
    let _ = (HEADER, HEADERS, header_hash(b""));
}
