"""The compile backends by name: `get_backend("inductor", device="cpu")` or `get_backend("neuron")`."""

from __future__ import annotations

from warmup.backends.base import Backend
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
