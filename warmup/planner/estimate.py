"""Rough compile-time estimates per signature, for the plan table and progress estimates.

Neuron: about a minute per new graph (TRL 1.16 release notes), about twelve for a new GRPO static-cache
size (no published source found: an assumption, see docs/compile-caches.md, section 6). Inductor:
measured on this project's CPU machines for tiny models (20-50 s a training graph); real models on
GPUs take longer, so these are lower bounds.
Once a warm-up has run, the service replaces these with measured compile seconds.
"""

from __future__ import annotations

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
