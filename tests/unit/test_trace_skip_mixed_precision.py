"""A call's autocast regions (mixed precision) name its artifact, and the rehearsal compiles and checks it in them:
Dynamo guards on them, so an artifact compiled outside the training process's regions would refuse every call."""

from __future__ import annotations

import torch

from warmup.trace_skip.artifacts import autocast_regions, autocast_state, describe_call


def test_a_call_under_cpu_autocast_is_named_apart_and_its_regions_are_entered_again() -> None:
    module, batch = torch.nn.Linear(2, 2), torch.ones(1, 2)
    plain = describe_call(module, (batch,), {})
    assert autocast_state((batch,), {}) == ()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # accelerate's mixed precision on CPU
        state = autocast_state((batch,), {})
        mixed = describe_call(module, (batch,), {})
    assert state == (("cpu", "bfloat16"),)
    assert mixed == plain.replace("train;grad;", "train;grad;autocast=cpu:bfloat16;")
    assert not torch.is_autocast_enabled("cpu")
    with autocast_regions(state):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert describe_call(module, (batch,), {}) == mixed
    assert not torch.is_autocast_enabled("cpu")
    with autocast_regions(()):
        assert describe_call(module, (batch,), {}) == plain
