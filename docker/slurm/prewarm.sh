#!/bin/bash
# CI pre-warming from a SLURM login node: submit the job's spec to the service, start workers as SLURM
# jobs (worker.sbatch, an array of WORKERS), and wait until every signature is warm (exit 0), one failed,
# or TIMEOUT seconds passed (exit 4). Extra arguments go to sbatch (the partition that trains):
#   WARMUP_SERVER=http://warmup.example:8000 WARMUP_TOKEN=wu_... (submit scope) \
#   WARMUP_DATABASE_URL=postgresql://... WARMUP_STORE_URL=s3://bucket/prefix \
#     prewarm.sh spec.yaml -p train
# The spec is warmed for this node's toolchain: the login node must run the training image on the same
# kind of machine as the nodes that train, else give SUBMIT_OPTIONS="--pool NAME" (a pool whose
# workers have run) or "--toolchain FILE" (`warmup toolchain` on a training node).
set -euo pipefail

SPEC=${1:?usage: prewarm.sh SPEC [sbatch options]}
shift
: "${WARMUP_SERVER:?set WARMUP_SERVER to the trl-warmup service URL}"
: "${WARMUP_TOKEN:?set WARMUP_TOKEN to a token with the submit scope}"
WORKERS=${WORKERS:-1}
TIMEOUT=${TIMEOUT:-3600}
SUBMIT_OPTIONS=${SUBMIT_OPTIONS:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The job first: a worker that starts before it finds nothing to claim and exits at once.
# shellcheck disable=SC2086
warmup submit "${SPEC}" --server "${WARMUP_SERVER}" ${SUBMIT_OPTIONS}
if [ "${WORKERS}" -gt 0 ]; then
    sbatch --array="1-${WORKERS}" "$@" "${HERE}/worker.sbatch"
fi
# The same spec again is the same job: --wait follows it.
# shellcheck disable=SC2086
exec warmup submit "${SPEC}" --server "${WARMUP_SERVER}" ${SUBMIT_OPTIONS} --wait --timeout "${TIMEOUT}"
