#!/usr/bin/env bash
# The system packages the tests need that pip cannot install, from Debian: `chromium` (the status page's
# tests, tests/support/chromium.py), `postgresql` (its initdb / pg_ctl start a throwaway server when none
# answers at 127.0.0.1:5432, tests/fixtures/services.py), and `slurm-wlm`, `munge` and `iproute2` (the
# two-node SLURM cluster in network namespaces, tests/fixtures/cluster.py). Installs only what is missing,
# says nothing when everything is there. Needs apt-get, and root (or sudo).
set -euo pipefail

missing=()
command -v chromium >/dev/null || missing+=(chromium)
# Where tests/fixtures/services.py looks for them: Debian's versioned directory, else PATH.
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
    && ! { command -v initdb && command -v pg_ctl; } >/dev/null; then
    missing+=(postgresql)
fi
{ command -v slurmctld && command -v slurmd && command -v sbatch; } >/dev/null || missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
command -v ip >/dev/null || missing+=(iproute2)
[ ${#missing[@]} -eq 0 ] && exit 0

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "install-test-deps: ${missing[*]} missing; run this as root" >&2
        exit 1
    fi
    as_root=(sudo)
fi
if ! command -v apt-get >/dev/null; then
    echo "install-test-deps: ${missing[*]} missing and there is no apt-get: install them" >&2
    exit 1
fi

echo "install-test-deps: installing ${missing[*]} (apt-get)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { "${as_root[@]}" apt-get update -q \
    && "${as_root[@]}" apt-get install -y -q "${missing[@]}"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "install-test-deps: apt-get failed installing ${missing[*]}" >&2
    exit 1
fi
