#!/usr/bin/env bash
# Install (once, cached under ~/.cache/context-ceiling) the Prometheus Operator CRD models from npm
# and print the path of a script that validates ServiceMonitor/PrometheusRule resources with them:
#   node "$(bash scripts/crd_validator.sh)" rendered.yaml
# (kubectl cannot validate custom resources offline; the operator's schemas ship in this package.)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${CEILING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-ceiling}/crd-validator"
if [ ! -f "$CACHE/.installed" ]; then
  command -v npm >/dev/null || { echo "crd_validator: npm (Node.js) is required" >&2; exit 2; }
  mkdir -p "$CACHE"
  cat > "$CACHE/package.json" <<'JSON'
{"name": "ceiling-crd-validator", "private": true, "type": "module",
 "dependencies": {"@kubernetes-models/prometheus-operator": "6.0.0", "js-yaml": "4.1.1"}}
JSON
  (cd "$CACHE" && npm install --no-audit --no-fund --loglevel=error >&2)
  touch "$CACHE/.installed"
fi
cp "$ROOT/tests/k8s/validate_crds.mjs" "$CACHE/validate_crds.mjs"
echo "$CACHE/validate_crds.mjs"
