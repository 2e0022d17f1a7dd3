"""A model compiled in place (`nn.Module.compile`: DeepSpeed's engine compiles the model so under ZeRO-1/2) is split
as torch.compile's wrapper is (warmup/trace_skip/split.py): hooked as torch sets its compiled call, read for its
backend and shape policy through the seam, its call redirected to run the forward eagerly around the served
backbone. Tiny modules, in process; Dynamo compiles nothing (the backbone's own compile is a stand-in)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from warmup._compat import torch as compat_torch
from warmup.errors import IncompatibleLibraryError
from warmup.trace_skip import artifacts, capture, losses, serve, split


class _Backbone(torch.nn.Module):
    """transformers' innermost model as the split sees one: its own base model, a plain forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    @property
    def base_model(self) -> _Backbone:
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class _Model(torch.nn.Module):
    """A causal LM as the split sees one: a backbone (`base_model`) and a head run around it."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _Backbone()
        self.head = torch.nn.Linear(2, 1)

    @property
    def base_model(self) -> _Backbone:
        return self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.model(x))


class _Artifact:
    """A loaded artifact as `TraceSkip.serve` calls it: its guards accept every call, and it runs the backbone."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def guard_check(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def __call__(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x)
        return _Backbone.forward(module, x)


IN_PLACE = "in place"  # nn.Module.compile (DeepSpeed's engine)
WRAPPED = "wrapped"  # torch.compile's OptimizedModule (accelerate)


def _compile(model: _Model, kind: str, **options: Any) -> Any:
    """The model compiled as `kind` compiles it: what its training calls. Nothing is traced until it is called."""
    if kind == IN_PLACE:
        model.compile(**options)
        return model
    return torch.compile(model, **options)


def _frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


def test_a_module_compiled_in_place_is_hooked_once_and_read_like_torch_compiles_wrapper():
    seen: list[Any] = []
    split.on_compiled_module(seen.append)
    split.on_compiled_module(seen.append)  # given twice: run once
    try:
        options = {"backend": "inductor", "mode": "max-autotune-no-cudagraphs", "dynamic": False}
        model = _compile(_Model(), IN_PLACE, **options)
        wrapped = _compile(_Model(), WRAPPED, **options)
    finally:
        split.remove_hook(seen.append)
    assert seen == [model, wrapped]
    module, backend, dynamic = compat_torch.compiled_module_parts(model)
    _, wrapped_backend, wrapped_dynamic = compat_torch.compiled_module_parts(wrapped)
    # the backend object torch.compile made, with the mode in it, and the shape policy: the wrapper's own
    assert module is model and (backend, dynamic) == (wrapped_backend, wrapped_dynamic) == (backend, False)
    assert backend.config.get("max_autotune") is True
    untouched = _Model()
    untouched.compile(backend="eager")  # no hook left: nothing split, nothing redirected
    assert seen == [model, wrapped]


def test_a_compiled_call_whose_dynamo_context_is_out_of_reach_is_refused_naming_the_seam():
    model = _Model()
    model._compiled_call_impl = lambda *args, **kwargs: None  # not torch.compile's function
    with pytest.raises(IncompatibleLibraryError, match="compiled_module_parts needs it"):
        compat_torch.compiled_module_parts(model)
    # a rehearsal then keeps no trace and says why, rather than failing the warm-up
    recorder = capture.Recorder()
    recorder.wrap(model)
    assert recorder.splits == 0 and (recorder.lost() or "").endswith(
        "trl-warmup's compiled_module_parts needs it (checked on torch 2.13.0, 2.14.1)"
    )


def _served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, off: str | None = None
) -> tuple[Any, serve.TraceSkip, list[tuple[Any, ...]]]:
    """A model compiled as `kind` in a training process over a cache with the split marker, its backbone's
    own compile a stand-in that runs it eagerly (each call noted), and one artifact that accepts every call."""
    (tmp_path / artifacts.TRACE_DIR).mkdir()
    (tmp_path / artifacts.TRACE_DIR / artifacts.SPLIT_MARKER).write_text(json.dumps({"split": "base_model"}))
    monkeypatch.setattr(serve, "_ACTIVE", [])
    monkeypatch.setattr(serve, "unavailable_reason", lambda: off)
    own_compiles: list[tuple[Any, ...]] = []

    def dynamo_compiled(fn: Callable[..., Any], *, backend: Any, dynamic: bool | None) -> Callable[..., Any]:
        def traced(*args: Any, **kwargs: Any) -> Any:
            own_compiles.append(args)
            return fn(*args, **kwargs)

        own_compiles.append((fn, backend, dynamic))
        return traced

    monkeypatch.setattr(compat_torch, "dynamo_compiled", dynamo_compiled)
    state = serve.enable(tmp_path)
    try:
        compiled = _compile(_Model(), kind, backend="eager", dynamic=False)
    finally:
        split.remove_hook(state.wrap)
    return compiled, state, own_compiles


@pytest.mark.parametrize("kind", [IN_PLACE, WRAPPED])
def test_a_compiled_models_call_runs_its_forward_eagerly_around_the_served_backbone(
    tmp_path, monkeypatch, kind
):
    compiled, state, own_compiles = _served(tmp_path, monkeypatch, kind)
    model = compiled if kind == IN_PLACE else compiled._orig_mod
    backbone = model.model
    # split off the same way for both kinds: the backbone compiled on its own with the model's backend and policy
    ((forward, backend, dynamic),) = own_compiles
    assert forward.__func__ is _Backbone.forward and forward.__self__ is backbone
    given = compat_torch.compiled_module_parts(torch.compile(_Model(), backend="eager", dynamic=False))
    assert (backend, dynamic) == given[1:]
    artifact = _Artifact()
    state._functions[id(backbone)] = [(artifact, (), "x")]
    x = torch.ones(3, 2)
    frames = _frames()
    assert torch.equal(compiled(x), model.head(backbone.linear(x)))
    assert len(artifact.calls) == 1 and torch.equal(artifact.calls[0], x)
    assert (state.hits, state.misses) == (1, 0) and len(own_compiles) == 1  # nothing traced, nor compiled
    assert _frames() == frames  # Dynamo saw no frame: the model's call ran eagerly
    if kind == WRAPPED:  # the bare model (TRL's generation) runs its backbone eagerly, as it did
        model(x)
        assert (state.hits, state.misses) == (1, 0)


@pytest.mark.parametrize("kind", [IN_PLACE, WRAPPED])
def test_with_the_trace_skip_off_a_compiled_model_still_traces_only_its_backbone_compiled_on_its_own(
    tmp_path, monkeypatch, kind
):
    switch = f"{split.ENV_VAR}=0"
    compiled, state, own_compiles = _served(tmp_path, monkeypatch, kind, off=switch)
    assert state.off == switch and state._functions == {}  # no artifact loaded
    x = torch.ones(3, 2)
    frames = _frames()
    compiled(x)
    # the warm-up's graph: the backbone on its own (here its stand-in), the rest of the forward eager
    assert (state.hits, state.misses) == (0, 1) and len(own_compiles) == 2 and own_compiles[1] == (x,)
    assert _frames() == frames


def test_zero_one_and_two_keep_their_trace_as_ddp_does_and_zero_three_says_why_not(monkeypatch):
    for mode in ("zero0", "zero1", "zero2"):
        assert losses.predicted_loss(world_size=3, sharding=mode) is None, mode
    zero3 = losses.predicted_loss(world_size=3, sharding="zero3") or ""
    assert zero3.startswith("zero3 shards the parameters"), zero3
    monkeypatch.setattr(capture, "unavailable_reason", lambda: None)
    recorder = capture.start_recording(2, "zero2")
    split.remove_hook(recorder.wrap)
    assert recorder.off is None and not recorder.job_off


def test_exec_enables_the_trace_skip_at_the_first_compile_of_either_kind_once(tmp_path, monkeypatch):
    (tmp_path / artifacts.TRACE_DIR).mkdir()
    (tmp_path / artifacts.TRACE_DIR / artifacts.SPLIT_MARKER).write_text("{}")
    monkeypatch.setattr(serve, "_ACTIVE", [])
    monkeypatch.setattr(serve, "_FIRST", [])
    exits: list[object] = []
    monkeypatch.setattr(serve.atexit, "register", exits.append)
    at_exit = object()
    # as torch is imported (no Dynamo yet): the modules compiled in place; then as Dynamo is imported: both kinds
    serve.enable_when_compiled(tmp_path, at_exit, in_place_only=True)  # type: ignore[arg-type]
    serve.enable_when_compiled(tmp_path, at_exit)  # type: ignore[arg-type]
    model = _compile(_Model(), IN_PLACE, backend="eager")
    state = serve.active()
    assert state is not None
    try:
        assert exits == [at_exit] and serve._FIRST[0].done
        assert "forward" in vars(model.model)  # split by the first compile's enable
        serve.enable_when_compiled(tmp_path, at_exit)  # type: ignore[arg-type]  # done: not hooked again
        wrapped = _compile(_Model(), WRAPPED, backend="eager")
        assert exits == [at_exit]
        assert "forward" in vars(wrapped._orig_mod.model)  # by the state's own hook
    finally:
        split.remove_hook(state.wrap)
