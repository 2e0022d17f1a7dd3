"""The phase WarmupCallback gives a model call, from what transformers passes to the model's forward."""

from __future__ import annotations

import torch

from warmup.callback import _shape_of


def test_a_call_with_a_kv_cache_is_generation_whatever_transformers_calls_the_argument():
    model = torch.nn.Linear(4, 4).train()
    ids = torch.zeros(2, 16, dtype=torch.long)
    step = torch.zeros(2, 1, dtype=torch.long)
    cache = object()
    # transformers 5.24 passes the cache as `cache`; older versions as `past_key_values`
    for name in ("cache", "past_key_values"):
        assert _shape_of(model, (), {"input_ids": ids, name: cache}, False, None) == (
            "generate_prefill",
            2,
            16,
        )
        assert _shape_of(model, (), {"input_ids": step, name: cache}, False, None) == (
            "generate_decode",
            2,
            1,
        )
    # without a cache, a grad-free call in train mode is an old-log-prob pass
    assert _shape_of(model, (), {"input_ids": ids, "cache": None}, False, None) == ("old_logps", 2, 16)
    assert _shape_of(model, (), {"input_ids": ids}, True, None) == ("train", 2, 16)
