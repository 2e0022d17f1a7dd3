"""Scripted completion lengths: make a model end each completion after a length chosen by its prompt.

Completion lengths decide the padded width P + C of every RL training pass, but a tiny random model almost
never samples EOS. This hook takes over the one decision that matters for shapes: while `generate` runs
(a forward with a KV cache), it bans EOS on each row until the row has produced `length - 1` tokens and
forces it then, where `length` is looked up from the row's first prompt token (and how many generate calls
that prompt was in before, so that one fixed eval set can produce different lengths across evaluations).
The weights, the sampling of the other tokens, the spec and the trainer code stay the real ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

FORCED = 1e4


@dataclass
class CompletionScript:
    """`length_of(first_prompt_token_id, calls_seen_before)` -> completion length (EOS included)."""

    length_of: Callable[[int, int], int]
    eos_token_id: int
    pad_token_id: int
    calls: Counter = field(default_factory=Counter)
    _targets: list[int] = field(default_factory=list)
    _produced: int = 0

    def attach(self, model) -> None:
        model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        if kwargs.get("cache", kwargs.get("past_key_values")) is None:
            return None  # a training or scoring forward: leave it alone
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids.shape[1] > 1:  # prefill: a new generate call
            first_real = (input_ids != self.pad_token_id).int().argmax(dim=1).tolist()
            tokens = [int(input_ids[row, i]) for row, i in enumerate(first_real)]
            self._targets = [self.length_of(token, self.calls[token]) for token in tokens]
            self.calls.update(set(tokens))
            self._produced = 0
        logits = output.logits[:, -1, :]
        for row, target in enumerate(self._targets):
            logits[row, self.eos_token_id] = FORCED if self._produced + 1 >= target else -FORCED
        self._produced += 1
        return None
