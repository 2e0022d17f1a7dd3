"""A call an artifact was made for that its guards still refuse is traced, and the trace skip's line says which
guard refused it (the getting-started job once traced every call under autocast without a word)."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from warmup._compat import torch as compat_torch
from warmup.trace_skip.artifacts import describe_call
from warmup.trace_skip.serve import TraceSkip


def test_a_refused_call_an_artifact_was_made_for_says_which_guard_refused_it(
    tmp_path: Path, monkeypatch
) -> None:
    module, batch = torch.nn.Linear(2, 2), torch.ones(1, 2)
    refusing = types.SimpleNamespace(guard_check=lambda *args, **kwargs: False)
    state = TraceSkip(tmp_path, available=2, loaded=2)
    made_for = describe_call(module, (batch,), {})
    state._functions[id(module)] = [
        (refusing, (), "train;grad;torch.float32[9x2]@cpu"),
        (refusing, (), made_for),
    ]
    split = types.SimpleNamespace(module=module, compiled=lambda *args, **kwargs: "traced")
    monkeypatch.setattr(
        compat_torch, "guard_failure", lambda fn, *a, **k: "GLOBAL_STATE changed: autocast(cpu)_enabled"
    )

    assert state.serve(split, (batch,), {}) == "traced"
    assert (state.hits, state.misses) == (0, 1)
    assert state.traced_because == {"guards refused (GLOBAL_STATE changed: autocast(cpu)_enabled)": 1}
    assert "; traced: 1 guards refused (GLOBAL_STATE changed: autocast(cpu)_enabled)" in state.describe()

    other = torch.ones(3, 2)  # a call no artifact was made for: a plain miss, nothing to explain
    assert state.serve(split, (other,), {}) == "traced"
    assert state.misses == 2 and sum(state.traced_because.values()) == 1


def test_torch_s_words_for_a_refusal_are_never_a_failure() -> None:
    assert compat_torch.guard_failure(object(), torch.ones(1)) == ""
