#!/usr/bin/env bash
# The coverage-guided fuzz campaign on stable Rust: installs cargo-afl (which builds AFL++ from
# the sources bundled in the crate, offline), builds the targets of fuzz/ instrumented, makes the
# GGUF seeds from the real models, and runs each target under AFL++ one after another.
#
# Usage: scripts/fuzz.sh [-e EXECS] [-s SECONDS] [TARGET...]
#   -e EXECS    stop each target after about this many executions (default 1000000)
#   -s SECONDS  and after at most this many seconds (default 3600)
#   TARGET      gguf, tokenizer, chat_template, request, disk_block (default: all five)
# Output: fuzz/out/<target>/ (AFL++'s queue, crashes, hangs, fuzzer_stats) and a summary line per
# target; exits 1 if any target saved a crash or a hang. Each input is limited to 1 s
# (a slower one is a hang) and 4 GiB of address space (an allocation past it aborts: a crash).
# Findings are fixed and kept as tests/fuzz/<target>/<what-it-found>, which
# tests/fuzz_regressions.rs replays in every `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

EXECS=1000000
SECONDS_LIMIT=3600
while getopts "e:s:" opt; do
  case "$opt" in
    e) EXECS="$OPTARG" ;;
    s) SECONDS_LIMIT="$OPTARG" ;;
    *) sed -n '5,9p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf tokenizer chat_template request disk_block)

# ---- install: cargo-afl, and AFL++ built by it (its `config --build` says so when already built) ----
if ! cargo afl --version >/dev/null 2>&1; then
  nice -n 10 cargo install --locked cargo-afl
fi
cargo afl config --build >/dev/null 2>&1 || true

# ---- build: the targets, instrumented (debug assertions and overflow checks on) ----
scripts/fetch-model.sh >/dev/null
(cd fuzz && nice -n 10 cargo afl build --release)
BIN=fuzz/target/release

# ---- seeds: the kept corpus and findings; for gguf also the real models cut down ----
OUT=fuzz/out
mkdir -p "$OUT"
for t in "${TARGETS[@]}"; do
  rm -rf "$OUT/seeds/$t"
  mkdir -p "$OUT/seeds/$t"
  cp tests/fuzz/corpus/"$t"/* "$OUT/seeds/$t/"
  if [ -d "tests/fuzz/$t" ]; then cp tests/fuzz/"$t"/* "$OUT/seeds/$t/"; fi
  if [ "$t" = gguf ]; then
    "$BIN/make-seeds" models "$OUT/seeds/gguf"
    # The tiny models (300-400 KB, every tensor loaded) cut AFL++ to a third of its speed; they
    # stay in the kept corpus that tests/fuzz_regressions.rs replays and mutates.
    rm -f "$OUT/seeds/gguf/"*-tiny.gguf
  fi
done

# ---- run: one target after another (the machine is shared) ----
failed=0
for t in "${TARGETS[@]}"; do
  rm -rf "${OUT:?}/$t"
  echo "fuzz.sh: $t: up to $EXECS executions or $SECONDS_LIMIT s"
  AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    AFL_SKIP_CRASHES=1 AFL_IGNORE_SEED_PROBLEMS=1 \
    nice -n 10 cargo afl fuzz -i "$OUT/seeds/$t" -o "$OUT/$t" -E "$EXECS" -V "$SECONDS_LIMIT" \
    -t 1000 -m 4096 -- "$BIN/fuzz-target" "$t" >"$OUT/$t.log" 2>&1 || true
  stats="$OUT/$t/default/fuzzer_stats"
  if [ ! -f "$stats" ]; then
    echo "fuzz.sh: $t: AFL++ did not start; see $OUT/$t.log"; tail -20 "$OUT/$t.log"; failed=1; continue
  fi
  get() { sed -n "s/^$1 *: *//p" "$stats"; }
  echo "fuzz.sh: $t: $(get execs_done) executions in $(get run_time) s ($(get execs_per_sec) exec/s)," \
    "$(get corpus_count) in the queue, edges $(get bitmap_cvg), crashes $(get saved_crashes), hangs $(get saved_hangs)"
  if [ "$(get saved_crashes)" != 0 ] || [ "$(get saved_hangs)" != 0 ]; then
    ls "$OUT/$t/default/crashes" "$OUT/$t/default/hangs"
    failed=1
  fi
done
exit "$failed"
