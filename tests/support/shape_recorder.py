"""Ground truth: record every model forward a real TRL trainer makes, as (phase, batch, seq_len, cache_len).

Hooks sit on the models themselves (policy, reference, teacher), so whatever TRL, transformers and
accelerate do around them, the shapes recorded are the ones the compiled graphs would see. Under
torch.compile a hook that runs inside Dynamo's trace also notes the forward as compiled; one that runs
eagerly does not, which is how a run tells which of its forwards torch.compile compiles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

# Trainer arguments every test run uses: CPU, fp32, nothing written or logged.
CPU_ARGS = {
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_strategy": "no",
    "disable_tqdm": True,
}

Shape = tuple[str, int, int, int | None]

# Trainer args that turn torch.compile on with Dynamo's cheap "eager" backend: Dynamo traces the same modules it
# would for Inductor (which frames it compiles does not depend on the backend), at a fraction of the cost.
DYNAMO_EAGER = {"torch_compile": True, "torch_compile_backend": "eager"}


@dataclass
class ShapeRecorder:
    seen: set[Shape] = field(default_factory=set)  # every forward
    compiled: set[Shape] = field(default_factory=set)  # the forwards Dynamo traced
    calls: int = 0
    graphs: int = 0  # graphs Dynamo handed to its backend during `compiling(recorder)`, hooked or not

    def attach(self, model, role: str = "policy"):
        """Record forwards of `model`; role is policy, ref or teacher. Returns the hook's removable handle."""
        import torch

        def hook(module, args, kwargs):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            if input_ids is None:
                input_ids = kwargs.get("inputs_embeds")
            batch, seq_len = int(input_ids.shape[0]), int(input_ids.shape[1])
            # transformers 5.24 passes the KV cache as `cache` (older versions: `past_key_values`).
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            cache_len = None
            if cache is not None:
                cache_len = _static_cache_len(cache)
                phase = "generate_prefill" if seq_len > 1 else "generate_decode"
            elif role in ("ref", "teacher"):
                phase = role
            elif torch.is_grad_enabled():
                phase = "train"
            else:
                phase = "old_logps" if module.training else "eval"
            shape = (phase, batch, seq_len, cache_len)
            self.seen.add(shape)
            if torch.compiler.is_compiling():
                self.compiled.add(shape)
            self.calls += 1

        return model.register_forward_pre_hook(hook, with_kwargs=True)


@contextlib.contextmanager
def compiling(recorder: ShapeRecorder) -> Iterator[None]:
    """Dynamo settings under which every new shape is traced again, so the hooks see it compiled.

    Automatic dynamic shapes would fold a second shape into a symbolic graph without tracing (and
    recording) it; Neuron compiles with dynamic=False anyway. Graphs of other runs are dropped. Counts
    the graphs Dynamo compiled into `recorder.graphs`.
    """
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    try:
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64):
            yield
    finally:
        recorder.graphs = counters["stats"]["unique_graphs"] - before
        torch._dynamo.reset()


def check_compiled(*modules) -> None:
    """Fail unless accelerate wrapped each module in torch.compile: otherwise a run shows nothing about it."""
    from torch._dynamo.eval_frame import OptimizedModule

    for module in modules:
        assert isinstance(module, OptimizedModule), f"{type(module).__name__} is not wrapped in torch.compile"


def _static_cache_len(cache) -> int | None:
    """The pinned length of a static KV cache; None for a dynamic cache."""
    from transformers import StaticCache

    if isinstance(cache, StaticCache):
        return int(cache.get_max_length())
    return None


def planned_shapes(plan) -> set[Shape]:
    return {(s.phase, s.batch, s.seq_len, s.cache_len) for s in plan.signatures}


def compiled_shapes(plan) -> set[Shape]:
    """The planned shapes whose signatures compile (not labelled eager)."""
    return {(s.phase, s.batch, s.seq_len, s.cache_len) for s in plan.signatures if s.compile != "eager"}
