# syntax=docker/dockerfile:1
# The trl-warmup API: `warmup serve` without the in-process worker (workers run as their own
# containers). Build from the repository root:
#   docker build -f docker/api.Dockerfile -t trl-warmup-api .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

# The API plans specs with TRL's config classes, so it installs torch: the CPU build is enough.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/warmup warmup

# A regular install: pip compiles the bytecode (with PYTHONDONTWRITEBYTECODE set, nothing else would,
# and every process would compile the sources again), and the package carries the migrations the
# server runs at start-up (warmup/db/migrations links to migrations/).
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY warmup ./warmup
COPY api ./api
COPY worker ./worker
COPY migrations ./migrations
# The project itself, from this directory: nothing to pin.
# hadolint ignore=DL3013
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" ".[server]"

USER 10001
# data_dir must be writable even with PostgreSQL and S3 configured; model configs are cached in HF_HOME.
ENV WARMUP_DATA_DIR=/var/lib/warmup/data \
    HF_HOME=/var/lib/warmup/hf

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# Off loopback, auth is required (WARMUP_AUTH=auto): create tokens with `warmup token create`.
ENTRYPOINT ["warmup", "serve", "--host", "0.0.0.0", "--no-worker"]
