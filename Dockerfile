# The context-ceiling image: the `ceiling` command, with only what the sidecar needs by default
# (and the `fast` extra, riptoken, the faster exact BPE, and the `bedrock` extra, botocore, which
# signs AWS Bedrock requests; no matplotlib, rich or tokenizers:
# EXTRAS=sweep adds what the in-cluster sweep Job needs,
# EXTRAS=sweep,hf the Hugging Face tokenizers too, EXTRAS=gigatoken the fastest exact BPE, opt-in:
# docs/counting.md). Non-root, read-only root filesystem friendly
# (writes only /tmp), tokenizer data inside the package, nothing fetched at start.
#
# It installs from a wheelhouse built beside it (`make image` runs `pip wheel` into
# build/wheels first), so the build itself needs no package index: the same Dockerfile builds
# with docker, podman or buildah, from any Debian-like base with python3 >= 3.11 and its venv
# module (BASE: python:3.11-slim-bookworm, or the Debian base `make image` makes with mmdebstrap).
ARG BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE} AS install
ARG EXTRAS=""
COPY build/wheels /wheels
RUN python3 -m venv /opt/ceiling \
 && /opt/ceiling/bin/pip install --no-cache-dir --no-index --find-links /wheels \
      "context-ceiling[fast,bedrock${EXTRAS:+,$EXTRAS}]" \
 && /opt/ceiling/bin/pip uninstall -y -q pip \
 && /opt/ceiling/bin/python -c "from context_ceiling.core.tokenizers import TiktokenCounter as T; assert T('o200k_base', 'riptoken').engine == T('cl100k_base', 'riptoken').engine == 'riptoken'"

FROM ${BASE}
COPY --from=install /opt/ceiling /opt/ceiling
RUN mkdir -p /etc/context-ceiling/config /etc/context-ceiling/ceilings
ENV PATH=/opt/ceiling/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
# a numeric user: no passwd entry needed, and Kubernetes' runAsNonRoot can verify it
USER 10001:10001
EXPOSE 8787
ENTRYPOINT ["ceiling"]
CMD ["serve", "--config", "/etc/context-ceiling/config/sidecar.yaml"]
