"""Compile backends: where each keeps its cache, what a process needs to hit it, what its artifacts are.

`get_backend("inductor", device="cpu")` or `get_backend("neuron")`; see `base.Backend` for the
protocol. Importing this package imports neither torch nor torch-neuronx.
"""

from __future__ import annotations

from warmup.backends.base import Backend, CompileCounter, FreshCompiles, recompile_limits
from warmup.backends.inductor import InductorBackend
from warmup.backends.neuron import NeuronBackend
from warmup.errors import SpecError

BACKEND_NAMES = ("inductor", "neuron")


def get_backend(name: str, device: str | None = None) -> Backend:
    """The backend called `name`; Inductor's device is `cpu` (default) or `cuda`."""
    if name == "inductor":
        device = device or "cpu"
        if device not in ("cpu", "cuda"):
            raise SpecError(f"backend 'inductor' runs on cpu or cuda, not {device!r}", loc="target.device")
        return InductorBackend(device)
    if name == "neuron":
        if device not in (None, "neuron"):
            raise SpecError(f"backend 'neuron' runs on device 'neuron', not {device!r}", loc="target.device")
        return NeuronBackend()
    raise SpecError(
        f"unknown backend {name!r}: expected one of {', '.join(BACKEND_NAMES)}", loc="target.backend"
    )


__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "CompileCounter",
    "FreshCompiles",
    "InductorBackend",
    "NeuronBackend",
    "get_backend",
    "recompile_limits",
]
