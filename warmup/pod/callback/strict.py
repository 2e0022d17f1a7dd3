"""The strict gate's words: when a run is strict, and the errors that stop it rather than compile a graph the
cache does not hold (`warmup exec --strict`)."""

from __future__ import annotations

import os
from pathlib import Path

from warmup.diagnosis import Diagnosis
from warmup.errors import UnwarmedCompileError
from warmup.pod.callback.report import Shape, label

STRICT_ENV = "WARMUP_STRICT"  # `warmup exec --strict` sets it for the training process


def strict_by_default() -> bool:
    """Whether the environment asks for strict (a callback not told either way)."""
    return (os.environ.get(STRICT_ENV) or "").strip().lower() in ("1", "true", "yes", "on")


def nothing_pulled(cache_dir: Path) -> UnwarmedCompileError:
    return UnwarmedCompileError(
        f"strict: no cache of this spec was pulled into {cache_dir}, so every compile "
        "would be one that was not warmed: pull it first (`warmup exec --strict` does), or "
        "train without strict"
    )


def would_compile(shape: Shape, what: str, diagnosis: Diagnosis) -> UnwarmedCompileError:
    return UnwarmedCompileError(
        f"strict: {label(shape)} {what} and training stops rather than compile it: {diagnosis.sentence()}"
    )


def recompiled(step: int) -> UnwarmedCompileError:
    return UnwarmedCompileError(
        f"strict: training compiled again at step {step} with no new shape (a recompile the "
        "plan does not foresee: a guard failed, or the graph broke); training stops"
    )
