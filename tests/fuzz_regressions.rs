//! The fuzz targets (`src/fuzz_entry.rs`) in the ordinary test run: every input the AFL++
//! campaign found a bug with (`tests/fuzz/<target>/`, named after what it found) and the kept
//! corpus (`tests/fuzz/corpus/<target>/`) are replayed, then each target gets a short random
//! mutation loop over that corpus (`EDGE_LLM_FUZZ_SECONDS`, default 20 s each; 0 skips it).
//! A panic or an input slower than `HANG_LIMIT` fails the test and saves the input under
//! `target/fuzz-failures/`.
//!
//! The coverage-guided campaign itself is `scripts/fuzz.sh` (AFL++ via `cargo afl`).

mod support;

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use edge_llm::fuzz;
use support::splitmix::Rng;

/// An input slower than this twice in a row is a hang (the slowest seed takes milliseconds).
const HANG_LIMIT: Duration = Duration::from_secs(2);
/// Mutated inputs are cut to this size.
const MAX_INPUT: usize = 1 << 20;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz")
}

/// The files of `dir`, sorted by name (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    out.retain(|p| p.is_file());
    out.sort();
    out
}

/// Whether the target can run: the default model is needed by all but `gguf`. Missing in CI
/// is a failure; elsewhere the test skips, saying why.
fn ready(target: &str) -> bool {
    if target == "gguf" || target == "disk_block" {
        return true;
    }
    match fuzz::vocabularies() {
        Ok(v) => {
            assert!(!v.is_empty());
            true
        }
        Err(e) => {
            support::skip_or_fail(&format!("fuzz target {target} needs the models: {e:#}"));
            false
        }
    }
}

/// Runs `data` through `target`; a panic or a hang is returned as the failure's description,
/// with the input saved.
fn run_one(target: &str, data: &[u8]) -> Result<(), String> {
    let run = || {
        let start = Instant::now();
        let result = panic::catch_unwind(AssertUnwindSafe(|| fuzz::run_target(target, data)));
        (result, start.elapsed())
    };
    let (mut result, mut elapsed) = run();
    if matches!(result, Ok(Ok(()))) && elapsed > HANG_LIMIT {
        // Once more: on a busy machine a thread can wait that long for a core.
        (result, elapsed) = run();
    }
    let why = match result {
        Ok(Ok(())) if elapsed <= HANG_LIMIT => return Ok(()),
        Ok(Ok(())) => format!("took {elapsed:?} (limit {HANG_LIMIT:?})"),
        Ok(Err(e)) => format!("could not run: {e:#}"),
        Err(p) => format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        ),
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let saved = dir.join(format!("{target}-{:016x}", fnv1a(data)));
    let _ = std::fs::write(&saved, data);
    Err(format!("{why} (input saved as {})", saved.display()))
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Replays the target's findings and corpus, then mutates the corpus for the set time.
fn replay_and_mutate(target: &str) {
    if !ready(target) {
        return;
    }
    let findings = files(&fuzz_dir().join(target));
    let corpus_files = files(&fuzz_dir().join("corpus").join(target));
    assert!(
        !corpus_files.is_empty(),
        "tests/fuzz/corpus/{target}/ holds no corpus"
    );
    let mut corpus = Vec::new();
    for path in findings.iter().chain(&corpus_files) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(why) = run_one(target, &data) {
            panic!("{target}: {} {why}", path.display());
        }
        corpus.push(data);
    }
    eprintln!(
        "{target}: {} findings and {} corpus files replayed",
        findings.len(),
        corpus_files.len()
    );

    let seconds: u64 = std::env::var("EDGE_LLM_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut rng = Rng(fnv1a(target.as_bytes()));
    let mut execs = 0u64;
    while Instant::now() < deadline {
        let base = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, base, other);
        if let Err(why) = run_one(target, &input) {
            panic!("{target}: a mutated input {why}");
        }
        execs += 1;
    }
    eprintln!("{target}: {execs} mutated inputs in {seconds} s, no failure");
}

#[test]
fn fuzz_gguf() {
    replay_and_mutate("gguf");
}

#[test]
fn fuzz_tokenizer() {
    replay_and_mutate("tokenizer");
}

#[test]
fn fuzz_chat_template() {
    replay_and_mutate("chat_template");
}

#[test]
fn fuzz_request() {
    replay_and_mutate("request");
}

#[test]
fn fuzz_disk_block() {
    replay_and_mutate("disk_block");
}

/// A few of AFL's havoc mutations, stacked: bit flips, interesting values, byte runs, block
/// deletion, duplication and splicing with another corpus entry.
fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    const INTERESTING: [u64; 10] = [
        0,
        1,
        0x7f,
        0x80,
        0xff,
        0x7fff,
        0xffff,
        0x7fff_ffff,
        0xffff_ffff,
        u64::MAX,
    ];
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(8) {
        let pos = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = pos.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = pos.min(v.len() - 1);
                v[i] = rng.next_u64() as u8;
            }
            2 => {
                let value = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1, 2, 4, 8][rng.below(4)];
                let bytes = &value.to_le_bytes()[..width];
                let end = (pos + width).min(v.len());
                v.splice(pos..end, bytes.iter().copied());
            }
            3 if !v.is_empty() => {
                let len = 1 + rng.below((v.len() - pos.min(v.len() - 1)).min(64));
                let start = pos.min(v.len() - 1);
                v.drain(start..(start + len).min(v.len()));
            }
            4 if !v.is_empty() => {
                let start = pos.min(v.len() - 1);
                let len = 1 + rng.below((v.len() - start).min(256));
                let chunk = v[start..start + len].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, chunk);
            }
            5 if !other.is_empty() => {
                let start = rng.below(other.len());
                let len = 1 + rng.below((other.len() - start).min(256));
                v.splice(pos..pos, other[start..start + len].iter().copied());
            }
            _ => {
                let byte = rng.next_u64() as u8;
                let n = 1 + rng.below(32);
                v.splice(pos..pos, std::iter::repeat_n(byte, n));
            }
        }
    }
    v.truncate(MAX_INPUT);
    v
}
