"""The training process's environment, computed on the pod before the training command starts: what
`warmup exec` sets for it and `warmup pull --print-env` prints (`child_environment`), the backend's part as
each training process would compute it (`training_process_environment`), and Inductor's CPU ISA probe
programs built into the cache directory so that the training process does not build them at its first
compile (`IsaProbes`). `warmup.activate` sets the same backend environment from inside the training process
(warmup/pod/activation.py).

Pod side: nothing here imports a server package or TRL, and torch only where a tag must be computed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmup.manifest import Manifest


# What `warmup exec` puts first on the training command's PYTHONPATH: its `sitecustomize` runs at start-up.
SITECUSTOMIZE_DIRECTORY = Path(__file__).resolve().parent / "_sitecustomize"
VLLM_CACHE_SUBDIR = "vllm"  # vLLM's own compile cache inside a cache dir, where a colocate rehearsal puts it


def vllm_environment(args: dict[str, Any], cache_dir: str | os.PathLike[str]) -> dict[str, str]:
    """`VLLM_CACHE_ROOT` for a job that generates with vLLM in its own processes (colocate mode): the cache
    dir's `vllm/`, where the rehearsal had vLLM compile (written against vLLM's documented cache layout,
    unverified here: docs/compile-caches.md). Empty for any other job. `warmup exec` and `warmup.activate`
    both set it, and the rehearsal compiles under it."""
    if args.get("use_vllm") and args.get("vllm_mode", "colocate") == "colocate":
        return {"VLLM_CACHE_ROOT": str(Path(cache_dir) / VLLM_CACHE_SUBDIR)}
    return {}


class IsaProbes:
    """Inductor's CPU probe programs, built for DEST while the toolchain is computed (or the image's), and
    copied into DEST once the install succeeded.

    The first time a process picks its CPU vector ISA, Inductor builds small probe programs with g++
    into its cache directory (computing the toolchain does it). A process started with the cache
    environment already set (`exec`, a shell after `--print-env`) would build them in DEST during its
    first training step, which the compile counter rightly sees as new files; build them here instead,
    in a staging directory, so that a failed pull still leaves DEST untouched (or in DEST itself when
    an earlier pull succeeded there, where they already are).
    """

    VARIABLE = "TORCHINDUCTOR_CACHE_DIR"

    def __init__(self, spec: Any, dest: str) -> None:
        from warmup.client.local import LOCAL_MANIFESTS_DIR

        self.target = Path(dest).expanduser().resolve()
        self.wanted = (spec.target.backend, spec.target.device) == ("inductor", "cpu")
        self.pulled_before = (self.target / LOCAL_MANIFESTS_DIR).is_dir()  # the probes are there already
        self.staging: Path | None = None
        if self.wanted and not self.pulled_before:
            self.staging = Path(tempfile.mkdtemp(prefix="warmup-isa-probes-"))

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Inductor's cache directory is the staging one (or DEST) while the toolchain is computed."""
        if not self.wanted:
            yield
            return
        previous = os.environ.get(self.VARIABLE)
        os.environ[self.VARIABLE] = str(self.staging or self.target)
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(self.VARIABLE, None)
            else:
                os.environ[self.VARIABLE] = previous

    def settle(self, installed: bool, toolchain_source: str) -> None:
        """Once the install has ended: if it succeeded, copy the probes into DEST (those built here, or,
        when the toolchain was found exactly in the image's memo rather than computed, those the image
        built when it was remembered: warmup.toolchain.memo.image_isa_probes), so the training process's
        first compile finds them; then remove the staging directory."""
        if self.staging is None:
            return
        if installed:
            for root in [self.staging, *self._images_probes(toolchain_source)]:
                for probe in [p for p in root.rglob("*") if p.is_file()]:
                    relative = probe.relative_to(root)
                    if relative.parts[0] != "locks" and not (self.target / relative).exists():
                        (self.target / relative).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(probe, self.target / relative)
        shutil.rmtree(self.staging, ignore_errors=True)

    @staticmethod
    def _images_probes(toolchain_source: str) -> list[Path]:
        """The image's probe programs, when this pod's toolchain is the one the image remembered."""
        from warmup.toolchain.memo import image_isa_probes, image_memo_path

        memo = image_memo_path() if toolchain_source == "exact" else None
        return [image_isa_probes(memo)] if memo is not None and image_isa_probes(memo).is_dir() else []


def child_environment(spec: Any, result: Any, server: str | None = None) -> dict[str, str]:
    """What `warmup exec` sets for the command, and `pull --print-env` prints: the backend's cache
    environment (on CPU with the thread count the cache was compiled for), the recompile limits (applied
    in every Python process by warmup/pod/_sitecustomize), vLLM's cache for a colocate job (`vllm_environment`), and
    the spec and server for the training callback."""
    from warmup.backends.base import recompile_limits

    env = training_process_environment(
        result.manifest, result.dest, spec.target.world_size, getattr(result, "toolchain_source", "")
    )
    threads = result.manifest.toolchain.get("num_threads")
    if result.manifest.device == "cpu" and isinstance(threads, int) and not os.environ.get("OMP_NUM_THREADS"):
        # The cache was compiled for this many threads per process (in Inductor's key). Left unset, a
        # launcher picks its own: `accelerate launch` (so `trl sft --config`) gives even one process 1.
        env["OMP_NUM_THREADS"] = str(threads)
    limit, accumulated = recompile_limits(result.manifest.plan_size)
    env["WARMUP_RECOMPILE_LIMIT"] = str(limit)
    env["WARMUP_ACCUMULATED_RECOMPILE_LIMIT"] = str(accumulated)
    env.update(vllm_environment(spec.args, result.dest))
    env["WARMUP_SPEC"] = spec.canonical_json()
    if server:
        env["WARMUP_SERVER"] = server
    paths = [
        str(SITECUSTOMIZE_DIRECTORY),
        *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p],
    ]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def training_process_environment(
    manifest: Manifest, dest: Any, world_size: int, toolchain_source: str = ""
) -> dict[str, str]:
    """The backend's environment as each training process computes it (`warmup.activate` does it in
    the process). On CPU, Inductor's key tag carries the vector ISA and the thread count. When the pull's
    toolchain holds them exactly (computed here, or remembered for a machine with the same CPU flags,
    cores and compiler), the tag is made from them: no torch import, no ISA probe on the way to the
    training command. A predicted toolchain is not trusted with it: the tag is computed (so that a
    wrong prediction can cost a miss, never a hit of code built for another ISA). Under torchrun each of
    `world_size` processes gets OMP_NUM_THREADS threads (1 when unset): the tag is computed with that
    count. This process is about to exit or exec, so changing its thread count changes nothing else."""
    facts = manifest.toolchain
    if (
        manifest.backend == "inductor"
        and manifest.device == "cpu"
        and toolchain_source in ("computed", "exact", "remembered")
        and isinstance(facts.get("cpu_isa"), str)
        and isinstance(facts.get("num_threads"), int)
    ):
        from warmup.backends.inductor import InductorBackend, cpu_key_tag

        tag = cpu_key_tag(facts["cpu_isa"], facts["num_threads"])
        return InductorBackend("cpu").env(str(dest), manifest.plan_size, key_tag=tag)
    if manifest.backend == "inductor" and manifest.device == "cpu" and world_size > 1:
        import torch

        from warmup.toolchain.probes import training_threads

        torch.set_num_threads(training_threads(world_size))
    return manifest.environment(str(dest))
