"""Ground truth: record every model forward a real TRL trainer makes, as (phase, batch, seq_len, cache_len).

Hooks sit on the models themselves (policy, reference, teacher), so whatever TRL, transformers and
accelerate do around them, the shapes recorded are the ones the compiled graphs would see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Shape = tuple[str, int, int, int | None]


@dataclass
class ShapeRecorder:
    seen: set[Shape] = field(default_factory=set)
    calls: int = 0
    # Record only forwards that torch.compile traces (the hook runs inside Dynamo's trace), not eager ones.
    compiled_only: bool = False

    def attach(self, model, role: str = "policy"):
        """Record forwards of `model`; role is policy, ref or teacher. Returns the hook's removable handle."""
        import torch

        def hook(module, args, kwargs):
            if self.compiled_only and not torch.compiler.is_compiling():
                return
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
            self.seen.add((phase, batch, seq_len, cache_len))
            self.calls += 1

        return model.register_forward_pre_hook(hook, with_kwargs=True)


def _static_cache_len(cache) -> int | None:
    """The pinned length of a static KV cache; None for a dynamic cache."""
    from transformers import StaticCache

    if isinstance(cache, StaticCache):
        return int(cache.get_max_length())
    return None


def planned_shapes(plan) -> set[Shape]:
    return {(s.phase, s.batch, s.seq_len, s.cache_len) for s in plan.signatures}
