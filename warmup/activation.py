"""`warmup.activate`: make this training process use (and hit) a warmed cache directory.

Call it before the trainer is built (before anything is compiled):

    import warmup
    warmup.activate("job.yaml", cache_dir="/cache")     # or a Spec
    trainer = SFTTrainer(...); trainer.train()

It sets what the warm-up worker set when it compiled, the same way: the backend's cache
environment (cache directory, compile key tag, Neuron flags and locks), the all-static shape
policy, and Dynamo's recompile limits sized from the spec's plan. When the directory carries the
manifest `warmup warm` writes (`trl-warmup.json`), the toolchain recorded there is compared with this
process's and a difference raises ToolchainMismatchError naming the fields, instead of a silent miss.

The returned `Activation` counts the compiles this process still does (`fresh_compiles()`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup.artifacts import MANIFEST_NAME
from warmup.backends import Backend, CompileCounter, FreshCompiles, get_backend, recompile_limits
from warmup.errors import NotWarmedError, SpecError
from warmup.spec import Spec, load_spec


@dataclass
class Activation:
    """What `activate` did: the backend, the cache dir, the environment set and the recompile limit."""

    backend: Backend
    cache_dir: Path
    env: dict[str, str]
    plan_size: int
    recompile_limit: int
    counter: CompileCounter = field(repr=False)

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
    spec = spec_or_path if isinstance(spec_or_path, Spec) else load_spec(_as_source(spec_or_path))
    cache = Path(cache_dir).expanduser().absolute()
    if not cache.is_dir():
        raise NotWarmedError(
            f"cache directory {cache} does not exist: warm it first (`warmup warm SPEC --cache-dir {cache}`) "
            "or pull it (`warmup pull`)"
        )
    backend = get_backend(spec.target.backend, spec.target.device)
    if check_toolchain:
        check_manifest_toolchain(cache, spec)
    size = plan_size if plan_size is not None else planned_size(spec)
    counter = backend.counter(cache)
    env = backend.configure_process(cache, size)
    if spec.args.get("use_vllm") and spec.args.get("vllm_mode", "colocate") == "colocate":
        # vLLM's own compile cache, where a colocate rehearsal put it (unverified: see docs/compile-caches.md)
        env = {**env, "VLLM_CACHE_ROOT": str(cache / "vllm")}
        os.environ["VLLM_CACHE_ROOT"] = env["VLLM_CACHE_ROOT"]
    return Activation(
        backend=backend,
        cache_dir=cache,
        env=env,
        plan_size=size,
        recompile_limit=recompile_limits(size)[0],
        counter=counter,
    )


def planned_size(spec: Spec) -> int:
    """How many signatures the spec plans (the recompile limit is sized from it)."""
    from warmup.planner import plan_spec

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


def check_manifest_toolchain(cache_dir: Path, spec: Spec) -> None:
    """Raise ToolchainMismatchError when the manifest's toolchain differs from this process's."""
    manifest = read_manifest(cache_dir)
    if manifest is None or "toolchain" not in manifest:
        return
    from warmup.toolchain import Toolchain, current_toolchain

    theirs = Toolchain.model_validate(manifest["toolchain"])
    ours = current_toolchain(spec.target.backend, spec.target.device, world_size=spec.target.world_size)
    ours.require_same(theirs, what=f"toolchain of {cache_dir}")


def _as_source(value: str | os.PathLike[str] | dict[str, Any]) -> str | Path | dict[str, Any]:
    return value if isinstance(value, dict | str) else Path(value)
