# syntax=docker/dockerfile:1
# A warm-up worker for Trainium (TorchNeuron). A compiled graph hits only under the training pods'
# toolchain (torch, torch-neuronx and neuronx-cc versions, compiler flags, LNC), so build it FROM the
# image the training pods run: an AWS Neuron PyTorch training image, or your image built on one.
# There is deliberately no default. From the repository root:
#   docker build -f docker/worker-neuron.Dockerfile \
#     --build-arg BASE_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:<tag of your training image> \
#     -t trl-warmup-worker-neuron .
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A regular install: pip compiles the bytecode (with PYTHONDONTWRITEBYTECODE set, nothing else would,
# and every process would compile the sources again), and the package carries the migrations the
# server runs at start-up (warmup/db/migrations links to migrations/).
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY warmup ./warmup
COPY api ./api
COPY worker ./worker
COPY migrations ./migrations
# Keep the image's stack: its torch and Neuron packages, and the transformers, accelerate, TRL and peft the
# training pods run where the image has them, are pinned to what is installed (a cache hit needs the very same
# versions), so pip fails rather than replacing one that is outside the extras' ranges (docs/compatibility.md:
# TorchNeuron 2.13.x and 2.14.x). `warmup doctor` then prints what is tested and what is off in this image.
# The project itself, from this directory: nothing to pin.
# hadolint ignore=DL3013
RUN python -m pip freeze \
        | grep -iE '^(torch|torch[-_]neuronx|torch[-_]xla|neuronx[-_]cc|libneuronxla)==' > /tmp/keep.txt \
    || { echo "BASE_IMAGE has no torch: use an AWS Neuron PyTorch training image" >&2; exit 1; } \
    && { python -m pip freeze | grep -iE '^(transformers|accelerate|trl|peft)==' >> /tmp/keep.txt || true; } \
    && python -m pip install -c /tmp/keep.txt ".[worker]" \
    && warmup doctor

# The Neuron device plugin hands the devices to the container; the DLC's default user is kept.
ENV HF_HOME=/var/lib/warmup/hf
# One process per NeuronCore group: `--concurrency 2` on a 4-core device gives cores 0,1 and 2,3.
ENTRYPOINT ["warmup", "worker", "--backend", "neuron"]
