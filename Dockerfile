# The context-ceiling image: the `ceiling` command (sidecar, sweep, push). Multi-stage, non-root,
# tokenizer data inside the package, nothing fetched at start. Build: docker build -t context-ceiling .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --upgrade pip build \
 && python -m build --wheel --outdir /wheels . \
 && pip wheel --no-cache-dir --wheel-dir /wheels /wheels/context_ceiling-*.whl

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels context-ceiling \
 && rm -rf /wheels \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ceiling \
 && python -c "from context_ceiling.core.tokenizers import load_encoding as l; l('o200k_base'); l('cl100k_base')"
USER 10001:10001
EXPOSE 8787
ENTRYPOINT ["ceiling"]
CMD ["serve", "--config", "/etc/context-ceiling/config/sidecar.yaml"]
