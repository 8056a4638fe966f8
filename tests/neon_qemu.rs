//! The AArch64 NEON kernels (csrc/quants_neon.c, and Mamba-2's scan in csrc/ssm_scan_neon.c)
//! against the scalar references, bit for bit, on
//! this x86-64 machine: the whole of csrc/ and tests/c/neon_check.c are cross-compiled with
//! `aarch64-linux-gnu-gcc` (warnings are errors) and run under `qemu-aarch64`, once on a CPU with
//! the dot-product instructions (`-cpu max`: NEON must be detected, chosen and equal the
//! references) and once on one without (`-cpu cortex-a53`: the references must run and NEON be
//! refused).
//!
//! `scripts/test.sh` installs both tools (Debian's gcc-aarch64-linux-gnu and qemu-user) and sets
//! EDGE_LLM_REQUIRE_QEMU=1, so in CI a missing tool fails the test; elsewhere it is skipped with a
//! message.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn tool(name: &str) -> Option<PathBuf> {
    let found = Command::new(name).arg("--version").output();
    found
        .is_ok_and(|o| o.status.success())
        .then(|| PathBuf::from(name))
}

#[test]
fn neon_kernels_equal_the_references_under_qemu() {
    let (Some(cc), Some(qemu)) = (tool("aarch64-linux-gnu-gcc"), tool("qemu-aarch64")) else {
        // Required where EDGE_LLM_REQUIRE_QEMU is set (scripts/test.sh sets it), not by CI=true.
        let required = std::env::var_os("EDGE_LLM_REQUIRE_QEMU").is_some();
        support::skip_or_fail_if(
            required.then_some("EDGE_LLM_REQUIRE_QEMU is set"),
            "aarch64-linux-gnu-gcc and qemu-aarch64 are needed (scripts/test.sh installs them)",
        );
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root.join("csrc"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    assert!(sources.iter().any(|p| p.ends_with("quants_neon.c")));
    sources.push(root.join("tests/c/neon_check.c"));
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("neon_check");
    // The flags build.rs gives every C file, plus warnings as errors.
    let built = Command::new(&cc)
        .args(["-O2", "-std=c11", "-fno-math-errno", "-ffp-contract=off"])
        .args(["-Wall", "-Wextra", "-Werror", "-static"])
        .arg("-I")
        .arg(root.join("csrc"))
        .args(&sources)
        .args(["-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "cross-compiling the kernels for AArch64 failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    for (cpu, args, what) in [
        ("max", &[][..], "with the dot product"),
        (
            "cortex-a53",
            &["expect-scalar"][..],
            "without the dot product",
        ),
    ] {
        let run = Command::new(&qemu)
            .args(["-cpu", cpu])
            .arg(&exe)
            .args(args)
            .env_remove("EDGE_LLM_ISA")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&run.stdout);
        let err = String::from_utf8_lossy(&run.stderr);
        eprintln!("qemu -cpu {cpu}: {out}");
        assert!(
            run.status.success(),
            "AArch64 {what} (qemu -cpu {cpu}):\n{out}{err}"
        );
    }
}
