"""Rough compile-time estimates per signature, for the plan table and progress estimates.

Neuron: about a minute per new graph (TRL 1.16 release notes), about twelve for a new GRPO static-cache
size (no published source found: an assumption, see docs/compile-caches.md, section 6). Inductor:
what the tiny test models' training graphs took on this project's CPU machines (docs/performance.md);
real models on GPUs take longer, so these are lower bounds.
Once a warm-up has run, the service replaces these with measured compile seconds.
"""

from __future__ import annotations

import statistics

from warmup.signature import Signature

# seconds per signature, by backend and by phase kind
_ESTIMATES = {
    "neuron": {"train": 60.0, "forward": 45.0, "generate_prefill": 60.0, "generate_decode": 720.0},
    "inductor": {"train": 35.0, "forward": 15.0, "generate_prefill": 0.0, "generate_decode": 0.0},
}


def estimate_seconds(signature: Signature, backend: str) -> float:
    """Estimated compile seconds of one signature on `backend` ("neuron" or "inductor")."""
    if backend == "inductor" and signature.compile == "eager":
        return 0.0  # runs outside torch.compile: nothing to compile (on Neuron every pass compiles)
    table = _ESTIMATES[backend]
    if signature.phase in table:
        return table[signature.phase]
    return table["forward"]


class CompileCosts:
    """Compile seconds per signature: recorded where the service has them, else the seed figures.

    `recorded` maps signature keys to the compile seconds the service recorded for them under the job's
    toolchain. A signature without a record takes `typical[(model, phase)]` when given: the median the
    service recorded under that toolchain for the same model config and phase (its own speed there);
    else the seed figure above.
    """

    def __init__(
        self,
        backend: str,
        recorded: dict[str, float] | None = None,
        typical: dict[tuple[str, str], float] | None = None,
    ) -> None:
        self.backend = backend
        self.recorded = dict(recorded or {})
        self.typical = dict(typical or {})

    def seconds(self, signature: Signature) -> float:
        if self.backend == "inductor" and signature.compile == "eager":
            return 0.0
        recorded = self.recorded.get(signature.key())
        if recorded is not None:
            return recorded
        typical = self.typical.get((signature.model, signature.phase))
        if typical is not None:
            return typical
        return estimate_seconds(signature, self.backend)

    def describe(self) -> str:
        if not (self.recorded or self.typical):
            return f"seed figures for {self.backend} (no compile recorded under this toolchain)"
        return (
            f"recorded under this toolchain: {len(self.recorded)} of these signatures, and the median of "
            f"{len(self.typical)} (model, phase) pair(s) for the others of that model and phase; seed figures for "
            f"{self.backend} elsewhere"
        )


def typical_seconds(samples: list[tuple[str, str, float]]) -> dict[tuple[str, str], float]:
    """Median compile seconds per (model, phase) from recorded (model, phase, seconds) samples."""
    grouped: dict[tuple[str, str], list[float]] = {}
    for model, phase, seconds in samples:
        grouped.setdefault((model, phase), []).append(seconds)
    return {key: statistics.median(values) for key, values in grouped.items()}
