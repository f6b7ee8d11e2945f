#!/usr/bin/env bash
# Build the image without a daemon or a registry (../shared/RECIPES.md): a Debian bookworm base
# made with mmdebstrap from the Debian mirror (cached), the wheelhouse from this machine's package
# index (`pip wheel` into build/wheels), then `buildah bud` of the repository's Dockerfile on it.
# With Docker or podman and a registry, the same Dockerfile builds on python:3.11-slim-bookworm:
#   python -m pip wheel --wheel-dir build/wheels '.[fast,bedrock]' && docker build -t context-ceiling .
# Env: IMAGE (tag, default localhost/context-ceiling:dev), EXTRAS (e.g. "sweep"; the fast extra is always in), PYTHON.
# Prints the tag.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${CEILING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-ceiling}/image"
IMAGE="${IMAGE:-localhost/context-ceiling:dev}"
EXTRAS="${EXTRAS:-}"
PYTHON="${PYTHON:-python3}"
BASE=localhost/context-ceiling-base:bookworm
BUILDAH=(buildah --storage-driver vfs)

if ! "${BUILDAH[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  mkdir -p "$CACHE"
  if [ ! -f "$CACHE/rootfs.tar" ]; then
    # the extension decides mmdebstrap's output format: write a .tar, then move it into place
    mmdebstrap --quiet --variant=apt --include=python3,python3-venv,ca-certificates \
      bookworm "$CACHE/rootfs.partial.tar" >&2
    mv "$CACHE/rootfs.partial.tar" "$CACHE/rootfs.tar"
  fi
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  ln "$CACHE/rootfs.tar" "$ctx/rootfs.tar" 2>/dev/null || cp "$CACHE/rootfs.tar" "$ctx/rootfs.tar"
  printf 'FROM scratch\nADD rootfs.tar /\n' >"$ctx/Containerfile"
  "${BUILDAH[@]}" bud --quiet --isolation chroot -f "$ctx/Containerfile" -t "$BASE" "$ctx" >&2
fi

rm -rf build/wheels
# (this machine's pip config names index folders that may not exist: those warnings are noise)
"$PYTHON" -m pip wheel --quiet --wheel-dir build/wheels ".[fast,bedrock${EXTRAS:+,$EXTRAS}]" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
"${BUILDAH[@]}" bud --quiet --pull=never --isolation chroot \
  --build-arg BASE="$BASE" --build-arg EXTRAS="$EXTRAS" -t "$IMAGE" . >&2
echo "$IMAGE"
