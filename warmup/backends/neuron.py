"""TorchNeuron (the native `neuron` device of torch-neuronx on AWS Trainium).

NOT YET VERIFIED ON TRAINIUM. This backend is written against TorchNeuron's documented and
source-read behaviour (docs/compile-caches.md, section 4) and tested here only where no hardware
is needed: its environment, and artifact collection over a directory laid out as TorchNeuron lays
it out. Run the end-to-end proof on a trn instance before relying on it.

What it relies on:
- TorchNeuron keeps one NEFF per compiled graph (eager ops and torch.compile graphs alike) in a
  flat, sharded store: `$TORCH_NEURONX_NEFF_CACHE_DIR/<k[0:2]>/<k[2:4]>/<k>.neff`, written atomically
  (temp file + rename), with no sidecar metadata. Those `.neff` files are the artifacts.
- Its file locks live in TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR (`locks/<key>.lock`), which must be on
  local storage (flock over NFS is unreliable); we point it at a local directory per cache dir.
- The NEFF key hashes the compiler arguments as a raw string (`--model-type transformer
  --auto-cast=none` + NEURON_CC_FLAGS) together with the target (trn1/2/3), LNC and opt level, so
  both sides set NEURON_CC_FLAGS to one canonical form and pin NEURON_LOGICAL_NC_CONFIG.
- The key leaves the neuronx-cc and torch-neuronx versions out; the toolchain carries them.
- The cache directory is read once, when the runtime first compiles: `configure_process` must run
  before any Neuron device work.

What of the trace it can skip (docs/compile-caches.md, "Skipping the trace"; unverified on hardware): its
caches start below Dynamo (the NEFF lookup, keyed by the StableHLO), so a warmed process still traces
every phase with Dynamo and AOTAutograd and lowers it to StableHLO before the NEFF is found. The HLO
cache (TORCH_NEURONX_HLO_CACHE_DIR, seen in 2026 code, not in the documentation read) is put inside the
cache dir, so that it travels with the entry and spares the lowering; the trace itself is skipped as
under Inductor, by the backbone artifacts of warmup/trace_skip/, which go under `trace/`.

Fresh compiles are counted from `torch_neuronx._C._get_compilation_cache_stats()` (persistent misses)
when available, and from `.neff` files appearing in the cache dir.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

from warmup._compat import torch as compat_torch
from warmup.artifacts import ArtifactFile, scan_files
from warmup.backends.base import CacheCompileCounter, recompile_limits
from warmup.toolchain.model import canonical_neuron_cc_flags, neuron_lnc, neuron_target_from_name

NEFF_PATH = re.compile(r"(?P<a>[0-9A-Za-z]{2})/(?P<b>[0-9A-Za-z]{2})/(?P<key>[0-9A-Za-z_\-]+)\.neff")
DEFAULT_NEFF_CACHE_DIR = "/tmp/neff_cache"
HLO_CACHE_ENV_VAR = "TORCH_NEURONX_HLO_CACHE_DIR"
HLO_DIR = "hlo"
TRACE_FILE = re.compile(r"trace/(?:[0-9a-f]{32}\.(?:aot|json)|split\.json)")


class NeuronBackend:
    name = "neuron"
    cache_env_var = "TORCH_NEURONX_NEFF_CACHE_DIR"
    lock_env_var = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"

    def __repr__(self) -> str:
        return "NeuronBackend()"

    def default_cache_dir(self) -> Path:
        return Path(os.environ.get(self.cache_env_var) or DEFAULT_NEFF_CACHE_DIR)

    @staticmethod
    def local_lock_dir(cache_dir: str | Path) -> Path:
        """A node-local lock directory for `cache_dir`: one per cache dir, under the local temp dir."""
        digest = hashlib.sha256(str(Path(cache_dir).absolute()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / "trl-warmup-neuron-locks" / digest

    def env(self, cache_dir: str | Path, plan_size: int) -> dict[str, str]:
        target = neuron_target_from_name(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"))
        return {
            self.cache_env_var: str(Path(cache_dir).absolute()),
            self.lock_env_var: str(self.local_lock_dir(cache_dir)),
            "NEURON_CC_FLAGS": canonical_neuron_cc_flags(os.environ.get("NEURON_CC_FLAGS")),
            "NEURON_LOGICAL_NC_CONFIG": str(neuron_lnc(target)),
            # the HLO cache inside the cache dir: it travels with the NEFFs (unverified on Trainium)
            HLO_CACHE_ENV_VAR: str(Path(cache_dir).absolute() / HLO_DIR),
            # transformers already compiles with dynamic=False on Neuron; say it for accelerate too
            "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
        }

    def configure_process(self, cache_dir: str | Path, plan_size: int) -> dict[str, str]:
        env = self.env(cache_dir, plan_size)
        if "torch_neuronx" in sys.modules:
            # TorchNeuron reads its cache variables once, in its compilation cache's constructor.
            import warnings

            warnings.warn(
                "torch_neuronx was imported before warmup.activate(): if the Neuron runtime has compiled "
                "anything already, it keeps its old cache directory; call activate() first",
                stacklevel=3,
            )
        os.environ.update(env)
        Path(env[self.cache_env_var]).mkdir(parents=True, exist_ok=True)
        Path(env[self.lock_env_var]).mkdir(parents=True, exist_ok=True)
        if "torch" in sys.modules:
            compat_torch.raise_recompile_limits(*recompile_limits(plan_size))
        return env

    def is_artifact(self, relative_path: str) -> bool:
        """Finished NEFFs at their sharded place (`<k[0:2]>/<k[2:4]>/<k>.neff`), the HLO cache's files (no
        lock or temp file) and the trace skip's artifacts."""
        if TRACE_FILE.fullmatch(relative_path):
            return True
        if relative_path.startswith(f"{HLO_DIR}/"):
            name = relative_path.rsplit("/", 1)[-1]
            return not (name.endswith((".lock", ".tmp", ".partial")) or name.startswith("."))
        match = NEFF_PATH.fullmatch(relative_path)
        if not match:
            return False
        key = match.group("key")
        return key[0:2] == match.group("a") and key[2:4] == match.group("b")

    def collect(self, cache_dir: str | Path) -> list[ArtifactFile]:
        return scan_files(cache_dir, self.is_artifact)

    def counter(self, cache_dir: str | Path) -> CacheCompileCounter:
        return CacheCompileCounter(self.is_artifact, Path(cache_dir), _cache_stats)


def _cache_stats() -> dict[str, int]:
    """TorchNeuron's compilation-cache misses, when its runtime exposes them (never without the SDK)."""
    module = sys.modules.get("torch_neuronx")
    getter = getattr(getattr(module, "_C", None), "_get_compilation_cache_stats", None)
    if getter is None:
        return {}
    try:
        stats = dict(getter())
    except Exception:  # the runtime is not initialised: nothing compiled yet
        return {}
    return {name: int(stats.get(name, 0)) for name in ("persistent_misses", "total_compilations")}
