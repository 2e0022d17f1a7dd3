"""Rough compile-time estimates per signature, for the plan table and progress estimates.

Neuron: about a minute per new graph, about twelve for a new GRPO static-cache size (TRL's Trainium
guide and the TRL 1.16 release notes). Inductor: measured on this project's CPU machines for tiny
models (20-50 s a training graph); real models on GPUs take longer, so these are lower bounds.
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
    toolchain. A signature without a record takes the median recorded for its phase under that toolchain,
    when there is one (the toolchain's own speed), else the seed figure above.
    """

    def __init__(self, backend: str, recorded: dict[str, tuple[str, float]] | None = None) -> None:
        self.backend = backend
        # signature key -> (phase, seconds)
        self.recorded = dict(recorded or {})
        by_phase: dict[str, list[float]] = {}
        for phase, seconds in self.recorded.values():
            by_phase.setdefault(phase, []).append(seconds)
        self.phase_medians = {phase: statistics.median(values) for phase, values in by_phase.items()}

    def seconds(self, signature: Signature) -> float:
        if self.backend == "inductor" and signature.compile == "eager":
            return 0.0
        record = self.recorded.get(signature.key())
        if record is not None:
            return record[1]
        if signature.phase in self.phase_medians:
            return self.phase_medians[signature.phase]
        return estimate_seconds(signature, self.backend)

    def describe(self) -> str:
        if not self.recorded:
            return f"seed figures for {self.backend} (no compile recorded under this toolchain)"
        return (
            f"{len(self.recorded)} compile time(s) recorded under this toolchain; per-phase medians for the "
            f"other signatures of a recorded phase, seed figures for {self.backend} elsewhere"
        )
