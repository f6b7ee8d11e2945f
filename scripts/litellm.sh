#!/usr/bin/env bash
# Install (once, cached under ~/.cache/context-ceiling/litellm) LiteLLM's proxy in its own venv:
# the peer the benchmarks measure the sidecar against. Its own venv keeps its many pins away from
# the project's. Prints the path of the litellm command.
set -euo pipefail
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/context-ceiling/litellm"
if [ ! -x "$CACHE/bin/litellm" ] || [ ! -f "$CACHE/.installed" ]; then
  python3 -m venv "$CACHE"
  "$CACHE/bin/pip" install -q --disable-pip-version-check 'litellm[proxy]>=1.108,<1.109' >&2
  touch "$CACHE/.installed"
fi
echo "$CACHE/bin/litellm"
