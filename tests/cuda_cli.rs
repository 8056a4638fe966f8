//! `--device` through the real binary. On a machine without a GPU (CI): `--device cuda` exits
//! non-zero with one clean line, no panic and no backtrace ("no CUDA GPU found" with the `cuda`
//! feature, "built without CUDA support" without it), and `--device auto` runs on the CPU with
//! the same greedy output as `--device cpu`. On a machine with a GPU the first check is skipped
//! (tests/cuda_kernels.rs and scripts/bench-cuda.sh cover the GPU). A KV cache type the CUDA
//! kernels do not keep (q4_1 and the others past f16, q8_0, q4_0) is refused in one line before
//! any GPU is probed, with or without one.

mod support;

use std::process::{Command, Output};

fn edge_llm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("binary starts")
}

fn model_arg() -> String {
    support::model_path().to_string_lossy().into_owned()
}

/// Whether this machine has a usable GPU and this build can use it.
fn gpu_here() -> bool {
    #[cfg(feature = "cuda")]
    return edge_llm::cuda::probe().is_ok();
    #[cfg(not(feature = "cuda"))]
    false
}

#[test]
fn device_cuda_without_a_gpu_is_one_clean_error() {
    if gpu_here() {
        eprintln!("a GPU is usable here: nothing to check");
        return;
    }
    let expected = if cfg!(feature = "cuda") {
        "no CUDA GPU found (libcuda not loadable)"
    } else {
        "built without CUDA support (rebuild with --features cuda)"
    };
    let m = model_arg();
    let text = std::env::temp_dir().join(format!("edge-llm-cuda-cli-{}.txt", std::process::id()));
    std::fs::write(
        &text,
        "one two three four five six seven eight nine ten ".repeat(200),
    )
    .unwrap();
    let file = text.to_string_lossy().into_owned();
    for args in [
        vec![
            "run", "-m", &m, "-p", "Hello", "-n", "4", "--device", "cuda",
        ],
        vec![
            "bench", "-m", &m, "-p", "8", "-n", "2", "-r", "1", "--device", "cuda",
        ],
        vec!["perplexity", "-m", &m, "-f", &file, "--device", "cuda"],
        // A q8_0 or q4_0 cache is the CUDA backend's too: it goes on to look for the GPU.
        vec![
            "run", "-m", &m, "-p", "Hello", "-n", "4", "--device", "cuda", "-ctk", "q8_0", "-ctv",
            "q4_0",
        ],
    ] {
        let out = edge_llm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail without a GPU");
        assert!(
            err.starts_with("error: ") && err.trim_end().lines().count() == 1,
            "{args:?}: one-line error, got {err:?}"
        );
        assert!(
            err.contains(expected),
            "{args:?}: {err:?} should say {expected:?}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?} printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let _ = std::fs::remove_file(&text);
}

#[test]
fn a_cache_type_the_cuda_kernels_do_not_keep_is_one_line_on_cuda() {
    let m = model_arg();
    for (k, v) in [("q4_1", "f16"), ("q8_0", "iq4_nl")] {
        let args = [
            "run", "-m", &m, "-p", "Hello", "-n", "4", "--device", "cuda", "-ctk", k, "-ctv", v,
        ];
        let out = edge_llm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        let want = format!(
            "error: --cache-type-k {k} --cache-type-v {v}: the CUDA backend keeps f16, q8_0 or q4_0 KV caches"
        );
        assert!(
            err.starts_with(&want) && err.trim_end().lines().count() == 1,
            "{args:?}: {err:?}"
        );
    }
}

#[test]
fn device_auto_runs_on_the_cpu_without_a_gpu() {
    if gpu_here() {
        eprintln!("a GPU is usable here: auto would pick it");
        return;
    }
    let m = model_arg();
    let args = |device: &'static str| {
        vec![
            "run".to_string(),
            "-m".into(),
            m.clone(),
            "-p".into(),
            "The capital of France is".into(),
            "-n".into(),
            "12".into(),
            "--temp".into(),
            "0".into(),
            "--device".into(),
            device.into(),
        ]
    };
    let run = |device: &'static str| {
        let a = args(device);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        edge_llm(&a)
    };
    let cpu = run("cpu");
    let auto = run("auto");
    assert!(
        cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&cpu.stderr)
    );
    assert!(
        auto.status.success(),
        "{}",
        String::from_utf8_lossy(&auto.stderr)
    );
    assert!(!cpu.stdout.is_empty());
    assert_eq!(auto.stdout, cpu.stdout, "auto and cpu differ");
    // Quiet in a pipe, as every log: the fallback line goes only to a terminal.
    assert!(
        auto.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&auto.stderr)
    );
}

#[test]
fn device_flag_rejects_unknown_values() {
    let out = edge_llm(&["run", "-m", &model_arg(), "-p", "Hi", "--device", "tpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tpu") && err.contains("cuda"), "{err}");
}
