# syntax=docker/dockerfile:1
# A warm-up worker for torch.compile (Inductor) on CPU or CUDA. Build from the repository root:
#   CPU:  docker build -f docker/worker.Dockerfile -t trl-warmup-worker .
#   CUDA: docker build -f docker/worker.Dockerfile \
#           --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t trl-warmup-worker-cuda .
# A cache hits only under the training pods' toolchain (Python, torch, transformers, trl versions,
# CPU ISA or GPU): build this image from the same base and versions as the training image.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Inductor builds C++ kernels (CPU) and Triton's launchers (CUDA) with the system compiler.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

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
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" ".[worker]"

USER 10001
ENV HF_HOME=/var/lib/warmup/hf

# The database and the store come from WARMUP_DATABASE_URL and WARMUP_STORE_URL (and the AWS_*
# variables for S3); add `--pool NAME` and `--concurrency N` as arguments.
ENTRYPOINT ["warmup", "worker", "--backend", "inductor"]
