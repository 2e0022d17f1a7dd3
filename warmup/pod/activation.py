"""`warmup.activate`: make this training process use (and hit) a warmed cache directory.

Call it before the trainer is built (before anything is compiled):

    import warmup
    warmup.activate("job.yaml", cache_dir="/cache")     # or a Spec
    trainer = SFTTrainer(...); trainer.train()

It sets what the warm-up worker set when it compiled, the same way: the backend's cache
environment (cache directory, compile key tag, Neuron flags and locks), the all-static shape
policy, and Dynamo's recompile limits sized from the spec's plan. When the directory carries the
manifest `warmup warm` writes (`trl-warmup.json`), or the one `warmup pull` keeps, the toolchain recorded
there is compared with this process's, computed exactly, and a difference raises ToolchainMismatchError
naming the fields, instead of a silent miss or a wrong-cache hit.

When the cache holds the trace skip's artifacts (warmup/trace_skip/), the model accelerate compiles
gets them before its first forward: its warmed backbone calls run without Dynamo's trace.

The returned `Activation` counts the compiles this process still does (`fresh_compiles()`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup import layout
from warmup.artifacts import MANIFEST_NAME
from warmup.backends.base import Backend, CompileCounter, FreshCompiles, recompile_limits
from warmup.backends.registry import get_backend
from warmup.errors import NotWarmedError, SpecError, ToolchainMismatchError
from warmup.job.spec import Spec, load_spec
from warmup.pod.training_env import vllm_environment
from warmup.toolchain.probes import prepare_current_toolchain, side_by_side
from warmup.trace_skip.serve import TraceSkip, enable


@dataclass
class Activation:
    """What `activate` did: the backend, the cache dir, the environment set and the recompile limit."""

    backend: Backend
    cache_dir: Path
    env: dict[str, str]
    plan_size: int
    recompile_limit: int
    counter: CompileCounter = field(repr=False)
    trace_skip: TraceSkip | None = None  # warmed calls served without Dynamo's trace (warmup/trace_skip/)

    def fresh_compiles(self) -> FreshCompiles:
        """The compiles this process did since activation (cache misses and new cache files)."""
        return self.counter.fresh()


def activate(
    spec_or_path: Spec | str | os.PathLike[str] | dict[str, Any],
    cache_dir: str | os.PathLike[str],
    *,
    plan_size: int | None = None,
    check_toolchain: bool = True,
) -> Activation:
    """Set this process up to hit the warmed cache in `cache_dir` for the job `spec_or_path`.

    `plan_size` overrides the number of signatures the recompile limit is sized from (by default the
    spec is planned). Raises NotWarmedError when `cache_dir` does not exist, ToolchainMismatchError
    when it was warmed under another toolchain.
    """
    from warmup.client.background import wait_for_pull

    spec = spec_or_path if isinstance(spec_or_path, Spec) else load_spec(_as_source(spec_or_path))
    wait_for_pull()  # under `warmup exec`, the cache may still be downloading beside this process
    cache = Path(cache_dir).expanduser().absolute()
    if not cache.is_dir():
        raise NotWarmedError(
            f"cache directory {cache} does not exist: warm it first (`warmup warm SPEC --cache-dir {cache}`) "
            "or pull it (`warmup pull`)"
        )
    backend = get_backend(spec.target.backend, spec.target.device)

    def sized() -> int:
        return plan_size if plan_size is not None else planned_size(spec)

    if check_toolchain:
        prepare_current_toolchain(spec.target.device)
        # The exact toolchain (hashing torch's sources, the ISA probe's child process: seconds that mostly
        # leave the interpreter free) is computed beside the planning, which imports TRL.
        size = side_by_side([sized, lambda: check_toolchains(cache, spec)])[0]
    else:
        size = sized()
    counter = backend.counter(cache)
    env = backend.configure_process(cache, size)
    if env.get(layout.ENV_VAR) == "1":  # a training process: its kernels come from the cache
        layout.defer_precompiled_headers()
    vllm = vllm_environment(spec.args, cache)  # what `warmup exec` sets too
    env = {**env, **vllm}
    os.environ.update(vllm)
    # before the trainer is built: accelerate's torch.compile gets the artifacts made for its model
    trace = enable(cache)
    return Activation(
        backend=backend,
        cache_dir=cache,
        env=env,
        plan_size=size,
        recompile_limit=recompile_limits(size)[0],
        counter=counter,
        trace_skip=trace,
    )


def planned_size(spec: Spec) -> int:
    """How many signatures the spec plans (the recompile limit is sized from it)."""
    from warmup.planner.planning import plan_spec

    try:
        return len(plan_spec(spec).signatures)
    except SpecError as error:
        raise SpecError(
            f"cannot size the recompile limit: planning the spec failed ({error}); "
            "pass plan_size= to activate()"
        ) from None


def read_manifest(cache_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest `warmup warm` wrote into a cache dir, or None."""
    path = Path(cache_dir) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise NotWarmedError(f"{path} is unreadable ({error}); warm the directory again") from None
    if not isinstance(manifest, dict):
        raise NotWarmedError(f"{path} is not a manifest (a JSON object); warm the directory again")
    return manifest


@dataclass(frozen=True)
class ToolchainCheck:
    """A training process's exact toolchain against the one the cache in `cache_dir` was pulled for."""

    cache_dir: Path
    pulled: dict[str, Any]
    actual: dict[str, Any]
    differences: dict[str, tuple[Any, Any]]  # field -> (this process, pulled for)

    def error(self) -> ToolchainMismatchError:
        """What a training process raises rather than use a cache pulled for other facts."""
        return ToolchainMismatchError(
            self.differences,
            what=f"toolchain the cache in {self.cache_dir} was pulled for (the facts a pod remembered or "
            "predicted without computing them; this process computed them exactly)",
            remedy="using it could load code compiled for another build or another CPU, so it is refused. "
            "The remembered facts are corrected now: pull again (`warmup pull` / `warmup exec` fetch the "
            "cache of this toolchain), or remove the directory to train without it",
        )


def verify_pulled_toolchain(cache_dir: str | os.PathLike[str], spec: Spec) -> ToolchainCheck | None:
    """Compute this process's toolchain exactly and compare it with the one `warmup pull` used for
    `cache_dir` (the pull may have remembered or predicted it: warmup.toolchain.memo.resolve_toolchain).
    None when no pull of this spec installed into `cache_dir`.

    The exact facts are what a training process that traces computes anyway: torch is imported, Inductor
    hashes torch's sources and picks the CPU's vector ISA at its first compile (both cached in the
    process). When the trace skip serves every call (warmup/trace_skip/) nothing else computes them:
    then they are this check's own start-up cost (`activate` computes them beside the planning). They are
    remembered, correcting the image's memo and the pull's: a
    stale or wrong memo costs one refused start, never a wrong-cache hit.
    """
    from warmup.client.local import read_local_manifest
    from warmup.toolchain.memo import remember_in_image, remember_toolchain
    from warmup.toolchain.model import Toolchain
    from warmup.toolchain.probes import current_toolchain

    cache = Path(cache_dir)
    manifest = read_local_manifest(cache, spec.key())
    if manifest is None:
        return None
    target = spec.target
    world_size = int(os.environ.get("WORLD_SIZE") or target.world_size)
    actual = current_toolchain(target.backend, target.device, world_size=world_size)
    differences = actual.diff(Toolchain.model_validate(manifest.toolchain))
    if "LOCAL_RANK" not in os.environ:  # a rank of torchrun sees other thread settings than its pod
        remember_in_image(actual, world_size=world_size)
        if differences and os.access(cache, os.W_OK):
            remember_toolchain(cache, actual, world_size=world_size)
    return ToolchainCheck(
        cache_dir=cache,
        pulled=manifest.toolchain,
        actual=actual.model_dump(mode="json"),
        differences=differences,
    )


def check_toolchains(cache_dir: Path, spec: Spec) -> None:
    """Raise ToolchainMismatchError when this process's exact toolchain differs from the one the cache in
    `cache_dir` was warmed (`check_manifest_toolchain`) or pulled (`verify_pulled_toolchain`) for."""
    check_manifest_toolchain(cache_dir, spec)
    pulled = verify_pulled_toolchain(cache_dir, spec)
    if pulled is not None and pulled.differences:
        raise pulled.error()


def check_manifest_toolchain(cache_dir: Path, spec: Spec) -> None:
    """Raise ToolchainMismatchError when the manifest's toolchain differs from this process's."""
    manifest = read_manifest(cache_dir)
    if manifest is None or "toolchain" not in manifest:
        return
    from warmup.toolchain.model import Toolchain
    from warmup.toolchain.probes import current_toolchain

    theirs = Toolchain.model_validate(manifest["toolchain"])
    ours = current_toolchain(spec.target.backend, spec.target.device, world_size=spec.target.world_size)
    ours.require_same(theirs, what=f"toolchain of {cache_dir}")


def _as_source(value: str | os.PathLike[str] | dict[str, Any]) -> str | Path | dict[str, Any]:
    return value if isinstance(value, dict | str) else Path(value)
