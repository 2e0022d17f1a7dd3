"""PyTorch Inductor (`torch.compile` on CPU and CUDA).

The cache is the directory TORCHINDUCTOR_CACHE_DIR names, shipped whole (less locks and temp
files): FX graph entries, AOTAutograd entries, the generated Python wrappers and, on CPU, the
compiled `.so` kernels. The Mega-Cache blob (`torch.compiler.save_cache_artifacts`) leaves the `.so`
files out, so every pod would run g++ again; on GPU the Triton kernels live under `triton/` in the
same directory (and are bundled into the FX entries too).

What a process needs to hit such a cache (set by `configure_process`, the same in a warm-up worker
and in a training pod):
- TORCHINDUCTOR_CACHE_DIR, with the FX graph and AOTAutograd caches forced on;
- TORCH_COMPILE_CACHE_KEY_TAG carrying the CPU vector ISA and thread count, because Inductor's key
  omits the ISA and a cache built for AVX-512 gives wrong numbers under AVX2;
- an all-static shape policy (accelerate's dynamo plugin `dynamic=False`), because with automatic
  dynamic shapes which graphs get compiled depends on the order shapes arrive in;
- Dynamo's recompile limits raised to the plan's size, because past the limit (8) new shapes
  silently run eager;
- the canonical kernel layout (warmup/layout.py, WARMUP_KERNEL_LAYOUT): Inductor keys each C++ kernel by
  its compiler command line, which names the folders torch and Python are installed in; under the layout
  they are named by their content, so a cache serves any install of the same wheels.

Fresh compiles in a running process are counted from Inductor's counters (FX graph and AOTAutograd
cache misses and bypasses) and from files appearing in the cache dir: the counters say "hit" even
when g++ had to rebuild a kernel, the new files do not lie.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from warmup import layout
from warmup._compat import torch as compat_torch
from warmup.artifacts import MANIFEST_NAME, ArtifactFile, scan_files
from warmup.backends.base import CacheCompileCounter, recompile_limits

KEY_TAG_PREFIX = "trl-warmup"
# The Inductor / AOTAutograd counters that mean "compiled here" rather than "loaded from the cache".
MISS_COUNTERS = (
    ("inductor", "fxgraph_cache_miss"),
    ("inductor", "fxgraph_cache_bypass"),
    ("aot_autograd", "autograd_cache_miss"),
    ("aot_autograd", "autograd_cache_bypass"),
)


def cpu_key_tag(cpu_isa: str, threads: int) -> str:
    """Inductor's TORCH_COMPILE_CACHE_KEY_TAG on CPU: the vector ISA and the thread count (neither is in
    Inductor's own key; docs/compile-caches.md section 3)."""
    return f"{KEY_TAG_PREFIX};isa={cpu_isa.replace(' ', '+')};threads={threads}"


class InductorBackend:
    name = "inductor"
    cache_env_var = "TORCHINDUCTOR_CACHE_DIR"

    def __init__(self, device: str = "cpu") -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"Inductor runs on cpu or cuda, not {device!r}")
        self.device = device

    def __repr__(self) -> str:
        return f"InductorBackend(device={self.device!r})"

    def default_cache_dir(self) -> Path:
        return Path(
            os.environ.get(self.cache_env_var) or Path(tempfile.gettempdir()) / "torchinductor_warmup"
        )

    def key_tag(self) -> str:
        """The TORCH_COMPILE_CACHE_KEY_TAG: on CPU the vector ISA and thread count (imports torch)."""
        if self.device == "cuda":
            return f"{KEY_TAG_PREFIX};cuda"
        import torch

        from warmup.toolchain.probes import cpu_vec_isa

        return cpu_key_tag(cpu_vec_isa(), torch.get_num_threads())

    def env(self, cache_dir: str | Path, plan_size: int, *, key_tag: str | None = None) -> dict[str, str]:
        """`key_tag`: the tag from toolchain facts already known exactly (a pod's `warmup exec`), so that
        this process need not import torch and probe the CPU again; else computed here."""
        return {
            self.cache_env_var: str(Path(cache_dir).absolute()),
            "TORCH_COMPILE_CACHE_KEY_TAG": key_tag or self.key_tag(),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
            # accelerate passes dynamic=False to torch.compile: one static graph per shape, in any order
            "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
            # kernels keyed by the content of torch's and Python's installs, not their folders (exec's
            # sitecustomize applies it in every process it starts; configure_process here)
            layout.ENV_VAR: "1",
        }

    def configure_process(self, cache_dir: str | Path, plan_size: int) -> dict[str, str]:
        env = self.env(cache_dir, plan_size)
        os.environ.update(env)
        Path(env[self.cache_env_var]).mkdir(parents=True, exist_ok=True)
        import torch.compiler.config

        compat_torch.import_compiler()  # the compiler stack: imported now, not in the first step
        # These configs read their variables when torch is imported, which may have happened already.
        torch.compiler.config.cache_key_tag = env["TORCH_COMPILE_CACHE_KEY_TAG"]
        compat_torch.enable_compile_caches()
        compat_torch.raise_recompile_limits(*recompile_limits(plan_size))
        layout.install()
        return env

    def is_artifact(self, relative_path: str) -> bool:
        name = relative_path.rsplit("/", 1)[-1]
        if relative_path == MANIFEST_NAME or relative_path.startswith("locks/"):
            return False
        if name.endswith((".lock", ".partial")):
            return False
        # write_atomic's temp files are `.<pid>.<thread>.tmp`
        return not (name.startswith(".") and name.endswith(".tmp"))

    def collect(self, cache_dir: str | Path) -> list[ArtifactFile]:
        return scan_files(cache_dir, self.is_artifact)

    def counter(self, cache_dir: str | Path) -> CacheCompileCounter:
        return CacheCompileCounter(self.is_artifact, Path(cache_dir), _miss_counts)


def _miss_counts() -> dict[str, int]:
    counters = compat_torch.dynamo_counters()
    if counters is None:
        return {name: 0 for _, name in MISS_COUNTERS}
    return {name: int(counters[group][name]) for group, name in MISS_COUNTERS}
