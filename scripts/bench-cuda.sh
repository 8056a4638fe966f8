#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in one call: builds with --features cuda, then
#   1. every CUDA kernel against the C reference on random data (tests/cuda_kernels.rs, ignored
#      by default because it needs a GPU), and the GPU forward pass against the CPU one;
#   2. greedy completions of the default model on --device cpu and --device cuda;
#   3. perplexity of the default model on both devices;
#   4. throughput with 1, 16 and 64 concurrent sessions sharing a 400-token system prompt
#      (edge-llm bench --sessions N --shared-prefix 400), on cuda and on cpu;
# and prints one table. Exits non-zero if a kernel test fails or a step errors.
# Usage: scripts/bench-cuda.sh [OUT_DIR]   (logs go to OUT_DIR, default target/bench-cuda)
# On a GPU machine with no Rust toolchain, point EDGE_LLM_BIN at a prebuilt `edge-llm` and
# EDGE_LLM_CUDA_KERNELS_TEST at the prebuilt tests/cuda_kernels.rs binary (`cargo test --release
# --features cuda --test cuda_kernels --no-run` prints its path); nothing is then built or fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/bench-cuda}
mkdir -p "$OUT"
[ -n "${EDGE_LLM_BIN:-}" ] || scripts/fetch-model.sh
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt" >&2

# NVRTC compiles the kernels at start-up unless nvcc is on PATH at build time; use the CUDA
# toolkit's libnvrtc when the loader finds it, else the PyPI wheel (as scripts/test.sh does).
if ! command -v nvcc >/dev/null && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  NVRTC_LIB="$PWD/.cuda-wheels/nvidia/cuda_nvrtc/lib"
  if [ ! -e "$NVRTC_LIB/libnvrtc.so.12" ]; then
    python3 -m pip install -q --disable-pip-version-check --no-deps --target .cuda-wheels "nvidia-cuda-nvrtc-cu12==12.9.86"
  fi
  export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -n "${EDGE_LLM_BIN:-}" ]; then
  BIN=$EDGE_LLM_BIN
else
  cargo build --release --locked --features cuda
  BIN=target/release/edge-llm
fi
"$BIN" run -m "$MODEL" --device cuda -p "Hello" -n 1 --temp 0 >/dev/null  # fails here, clearly, without a usable GPU

# 1. Kernels and the forward pass against the C reference.
kernels_rc=0
if [ -n "${EDGE_LLM_CUDA_KERNELS_TEST:-}" ]; then
  "$EDGE_LLM_CUDA_KERNELS_TEST" --ignored --test-threads=1 --nocapture >"$OUT/kernels.log" 2>&1 || kernels_rc=$?
else
  cargo test --release --locked --features cuda --test cuda_kernels -- --ignored --test-threads=1 --nocapture \
    >"$OUT/kernels.log" 2>&1 || kernels_rc=$?
fi

# 2. Greedy completions.
PROMPTS=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village,")
: >"$OUT/greedy.tsv"
for p in "${PROMPTS[@]}"; do
  cpu=$("$BIN" run -m "$MODEL" --device cpu -p "$p" -n 64 --temp 0 --ignore-eos)
  gpu=$("$BIN" run -m "$MODEL" --device cuda -p "$p" -n 64 --temp 0 --ignore-eos)
  printf '%s\t%s\t%s\n' "$p" "$(printf %s "$cpu" | base64 -w0)" "$(printf %s "$gpu" | base64 -w0)" >>"$OUT/greedy.tsv"
done

# 3. Perplexity (8 chunks of 512 tokens).
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || { cat README.md src/*.rs src/*/*.rs >"$OUT/ppl-text.txt"; TEXT="$OUT/ppl-text.txt"; }
# The CPU run writes its log-probabilities; the GPU run reads them: KL divergence, same top.
"$BIN" perplexity -m "$MODEL" --device cpu -f "$TEXT" -c 512 --chunks 8 \
  --kl-divergence-base "$OUT/cpu.kld" >"$OUT/ppl-cpu.txt" 2>"$OUT/ppl-cpu.log"
"$BIN" perplexity -m "$MODEL" --device cuda -f "$TEXT" -c 512 --chunks 8 \
  --kl-divergence-base "$OUT/cpu.kld" --kl-divergence >"$OUT/ppl-cuda.txt" 2>"$OUT/ppl-cuda.log"
rm -f "$OUT/cpu.kld"

# 4. Throughput: N sessions, each 400 shared tokens + 16 own, 64 generated; medians of 3.
for d in cuda cpu; do
  for n in 1 16 64; do
    "$BIN" bench -m "$MODEL" --device "$d" --sessions "$n" --shared-prefix 400 -p 16 -n 64 -r 3 --json \
      >"$OUT/bench-$d-$n.txt" 2>"$OUT/bench-$d-$n.log"
  done
done

python3 - "$OUT" "$kernels_rc" <<'PY'
import base64, json, os, re, sys
out, kernels_rc = sys.argv[1], int(sys.argv[2])
log = open(os.path.join(out, "kernels.log")).read()
rows = []
for m in re.finditer(r"^test (\S+) \.\.\. (ok|FAILED)", log, re.M):
    rows.append((f"kernel test {m.group(1)}", m.group(2), ""))
worst = {}
for m in re.finditer(r"^\s*(\S+) rows\s+(\d+): ([0-9.e+-]+)$", log, re.M):
    worst[m.group(1)] = max(worst.get(m.group(1), 0.0), float(m.group(3)))
for t, e in worst.items():
    rows.append((f"matmul {t} max rel. error vs C", f"{e:.2e}", "budget 2e-5"))
m = re.search(r"prefill logits: against the emulator ([0-9.e+-]+), against the CPU ([0-9.e+-]+), mean KLD ([0-9.e+-]+)", log)
if m:
    rows.append(("forward prefill logits rel. error vs emulator", m.group(1), "budget 1e-3"))
    rows.append(("forward prefill vs CPU: max rel. error, mean KLD", f"{m.group(2)}, {m.group(3)}", "KLD budget 0.01"))
m = re.search(r"24 decode steps: mean KLD ([0-9.e+-]+), same top (\d+)/24", log)
if m:
    rows.append(("forward 24 decode steps vs CPU: mean KLD, same top", f"{m.group(1)}, {m.group(2)}/24", "KLD budget 0.01"))
for line in open(os.path.join(out, "greedy.tsv")):
    p, c, g = line.rstrip("\n").split("\t")
    c, g = base64.b64decode(c).decode(), base64.b64decode(g).decode()
    if c == g:
        verdict = "identical"
    else:
        i = next((i for i, (a, b) in enumerate(zip(c, g)) if a != b), min(len(c), len(g)))
        verdict = f"differ from char {i}"
    rows.append((f"greedy 64 tokens: {p!r}", verdict, ""))
ppl = {}
for d in ("cpu", "cuda"):
    m = re.search(r"(?:PPL = |Mean PPL\(Q\)\s*:\s*)([0-9.]+)", open(os.path.join(out, f"ppl-{d}.txt")).read())
    ppl[d] = float(m.group(1)) if m else float("nan")
rows.append(("perplexity 8x512 cpu / cuda", f"{ppl['cpu']:.4f} / {ppl['cuda']:.4f}", f"rel. diff {abs(ppl['cuda'] - ppl['cpu']) / ppl['cpu']:.2e}"))
kl = open(os.path.join(out, "ppl-cuda.txt")).read()
for name, label in (("Mean    KLD", "mean KLD"), ("Same top p", "same top")):
    m = re.search(re.escape(name) + r":\s*([^\n]+)", kl)
    rows.append((f"perplexity 8x512 cuda against cpu: {label}", m.group(1).strip() if m else "?", ""))
for d in ("cuda", "cpu"):
    for n in (1, 16, 64):
        text = open(os.path.join(out, f"bench-{d}-{n}.txt")).read().strip().splitlines()
        j = json.loads(text[-1]) if text else {}
        rows.append((f"{d}: {n} sessions, shared prefix 400", f"{j.get('aggregate_gen_tokens_per_s', float('nan')):.1f} tok/s",
                     f"TTFT median {j.get('ttft_ms_median', float('nan')):.0f} ms, prefix hits {j.get('prefix_cache_hit_rate', float('nan')):.3f}"))
w = max(len(r[0]) for r in rows)
print(f"| {'check':<{w}} | result | note |")
print(f"|{'-' * (w + 2)}|---|---|")
for r in rows:
    print(f"| {r[0]:<{w}} | {r[1]} | {r[2]} |")
if kernels_rc != 0:
    print(f"\nkernel tests FAILED (exit {kernels_rc}); see {out}/kernels.log", file=sys.stderr)
    sys.exit(1)
PY
