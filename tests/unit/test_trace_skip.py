"""The trace skip's bookkeeping (warmup/trace_skip/) without compiling: what keys an artifact, which
guards are kept, which files a training process considers, and what it says when it cannot skip."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from warmup.pod.callback import timings as timing_report
from warmup.trace_skip import artifacts, capture, losses, serve, split


@dataclass
class _Config:
    values: dict[str, object]

    def to_dict(self) -> dict[str, object]:
        return dict(self.values)


class _Model:
    def __init__(self, **values: object) -> None:
        self.config = _Config({"hidden_size": 64, "rms_norm_eps": 1e-6, **values})


def test_the_config_digest_changes_with_one_field_and_not_with_where_the_model_came_from():
    base = artifacts.config_digest(_Model())
    assert artifacts.config_digest(_Model(rms_norm_eps=1e-5)) != base
    assert artifacts.config_digest(_Model(_name_or_path="/other/checkpoint", use_cache=False)) == base


class _PeftModel:
    """A PEFT wrapper as `adapted_model` sees one: peft's class, `get_base_model`, `peft_config`."""

    __module__ = "peft.peft_model"

    def __init__(self, model: _Model, **settings: object) -> None:
        self.model = model
        self.peft_config = {
            "default": _Config({"r": 8, "base_model_name_or_path": "/warm/model", **settings})
        }

    def get_base_model(self) -> _Model:
        return self.model


def test_an_adapted_models_digest_holds_its_adapters_settings_but_not_where_they_came_from():
    model = _Model()
    adapted, adapters = split.adapted_model(_PeftModel(model, target_modules={"q_proj", "v_proj"}))
    assert adapted is model and split.adapted_model(model) == (model, {})
    digest = artifacts.config_digest(model, adapters)
    assert digest != artifacts.config_digest(model)

    def other(**settings: object) -> str:
        return artifacts.config_digest(model, split.adapted_model(_PeftModel(model, **settings))[1])

    assert other(target_modules={"v_proj", "q_proj"}, base_model_name_or_path="/user/weights") == digest
    assert other(target_modules={"q_proj", "v_proj"}, r=16) != digest


@dataclass
class _Guard:
    name: str
    guard_type: str
    derived_guard_types: tuple[str, ...] = ()
    is_global: bool = False


def test_the_saved_guards_are_the_arguments_and_the_global_state_less_what_cannot_be_serialised():
    keep = artifacts.guard_filter(frozenset({"func", "old_name"}))
    guards = [
        _Guard("kwargs['input_ids']", "TENSOR_MATCH"),
        _Guard("args[0].config.use_cache", "CONSTANT_MATCH"),
        _Guard("", "GRAD_MODE"),
        _Guard("func.__name__", "CONSTANT_MATCH"),  # a decorator's closure cell
        _Guard("args[0]._modules['model']", "NN_MODULE"),
        _Guard("args[0].forward", "TYPE_MATCH", ("ID_MATCH",)),
        _Guard("G['torch'].Tensor", "DUPLICATE_INPUT", is_global=True),
    ]
    assert keep(guards) == [True, True, True, False, False, False, False]


def _artifact(folder: Path, name: str, **record: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.aot").write_bytes(b"artifact")
    meta = {"format": artifacts.FORMAT, "module": "m.Backbone", "config": "c", "call": "x", **record}
    (folder / f"{name}.json").write_text(json.dumps(meta))


def test_a_training_process_considers_only_complete_artifacts_of_its_format(tmp_path):
    folder = tmp_path / artifacts.TRACE_DIR
    _artifact(folder, "a" * 32)
    _artifact(folder, "b" * 32, format=artifacts.FORMAT + 1)
    _artifact(folder, "c" * 32)
    (folder / f"{'c' * 32}.aot").unlink()
    (folder / artifacts.SPLIT_MARKER).write_text("{}")
    records = serve.TraceSkip(tmp_path).records()
    assert [path.name for path, _ in records] == [f"{'a' * 32}.aot"]


def test_the_switch_still_splits_as_the_warm_up_did_and_loads_nothing(tmp_path, monkeypatch, caplog):
    _artifact(tmp_path / artifacts.TRACE_DIR, "a" * 32)
    (tmp_path / artifacts.TRACE_DIR / artifacts.SPLIT_MARKER).write_text("{}")
    monkeypatch.setenv(split.ENV_VAR, "0")
    monkeypatch.setattr(serve, "_ACTIVE", [])
    hooks: list[object] = []
    monkeypatch.setattr(serve, "on_compiled_module", hooks.append)
    with caplog.at_level(logging.WARNING, logger="warmup.trace_skip"):
        state = serve.enable(tmp_path)
    # the backbone is split (the warmed graphs), and the artifacts are left alone
    assert hooks == [state.wrap] and serve.active() is state
    assert state.off == f"{split.ENV_VAR}=0" and state.available == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"trace skip off: {split.ENV_VAR}=0; Dynamo traces the backbone compiled on its own, as the warm-up "
        "split it, and the warmed cache serves it"
    ]
    state.misses = 3
    assert state.describe() == f"trace skip off ({split.ENV_VAR}=0); 3 call(s) traced"


def test_a_cache_warmed_without_the_split_turns_it_off_and_says_why_once(tmp_path, caplog):
    _artifact(tmp_path / artifacts.TRACE_DIR, "a" * 32)
    with caplog.at_level(logging.WARNING, logger="warmup.trace_skip"):
        state = serve.enable(tmp_path)
    assert state.off == "the cache was warmed without it"
    assert state.describe() == "trace skip off (the cache was warmed without it)"
    assert [r.getMessage() for r in caplog.records] == [
        "trace skip off: the cache was warmed without it; Dynamo traces every graph, the warmed cache serves it"
    ]
    assert serve.active() is None


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(split.ENV_VAR, "0")
    assert split.unavailable_reason() == f"{split.ENV_VAR}=0"


def test_what_a_run_reports(tmp_path):
    state = serve.TraceSkip(tmp_path, available=3, loaded=2, hits=5, misses=1, load_seconds=0.25)
    state.refuse("for another model config")
    assert state.describe() == (
        "trace skip: 5 call(s) served without tracing, 1 traced; 2 of 3 artifact(s) loaded in 0.25 s; "
        "refused: 1 for another model config"
    )
    timings = timing_report.compile_timings(first_step_s=1.5)
    assert set(timings) >= {"trace_s", "backend_s", "cache_load_s", "first_step_s"}
    assert timings["first_step_s"] == 1.5


@pytest.mark.parametrize("grad", [True, False])
def test_a_call_is_described_by_what_a_graph_specialises_on(grad):
    import torch

    module = torch.nn.Linear(2, 2).train(grad)
    with torch.set_grad_enabled(grad):
        text = artifacts.describe_call(
            module, (torch.zeros(4, 8, dtype=torch.long),), {"use_cache": False, "n": 3}
        )
    mode = "train;grad" if grad else "eval;no_grad"
    assert text == f"{mode};torch.int64[4x8]@cpu,use_cache=False,n=3"


def test_the_numeric_check_is_bitwise_where_a_fresh_compile_reproduces_itself_and_spread_bound_elsewhere():
    import torch

    out, grad = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.25])
    nudged = out + torch.tensor([0.0, 2e-7])
    assert capture._differences([[out, None], [out, None]], [out, None], exact=True) is None
    problem = capture._differences([[out], [out]], [nudged], exact=True)
    assert problem is not None and "differs from a fresh compile's (bitwise" in problem
    assert capture._differences([[out], [out]], [nudged], exact=False) is None
    # a value the fresh compile does not reproduce (a parallel scatter-add): bounded by its own spread
    wobble = grad + torch.tensor([1e-6, 0.0])
    assert capture._differences([[grad], [wobble]], [grad - 2e-6], exact=True) is None
    assert capture._differences([[grad], [grad], [wobble]], [grad - 2e-6], exact=True) is None
    far = capture._differences([[grad], [wobble]], [grad + 1e-3], exact=True)
    assert far is not None and "beyond 4x its own spread" in far
    missing = capture._differences([[out, grad], [out, grad]], [out, None], exact=True)
    assert missing == "value 1: a gradient is missing on one side"


def _checked(monkeypatch, fresh_runs, served):
    """`compare` with the fresh compile's runs and the artifact's values given (no compile); also the thread
    counts each run saw."""
    import ctypes
    import types

    import torch

    omp = ctypes.CDLL("libgomp.so.1")  # torch's CPU build loads it (its own copy, under this soname)
    values = iter([*fresh_runs, served])
    threads: list[int] = []

    def run(call, fn, autocast):  # the largest OpenMP team a kernel could get now
        threads.append(1 if omp.omp_get_max_active_levels() == 0 else torch.get_num_threads())
        return next(values)

    monkeypatch.setattr(capture, "_run", run)
    module = torch.nn.Linear(1, 1)
    split = types.SimpleNamespace(module=module, compiled=None)
    call = types.SimpleNamespace(split=split, args=(), kwargs={}, grad=True, training=True, autocast=())
    loaded = types.SimpleNamespace(guard_check=lambda *a, **k: True)
    return capture.compare(call, loaded, exact=True), threads


def test_the_numeric_check_runs_every_kernel_on_one_thread_and_refuses_any_other_bit(monkeypatch):
    import torch

    before = torch.get_num_threads()
    grad = torch.tensor([1240.0, 3.0])
    accepted, threads = _checked(monkeypatch, [[grad], [grad.clone()]], [grad.clone()])
    assert accepted is None and threads == [1, 1, 1]
    assert torch.get_num_threads() == before
    # one unit in the last place of a value the fresh compile reproduces: refused, whatever the value
    problem, _ = _checked(monkeypatch, [[grad], [grad.clone()]], [grad + torch.tensor([1.2e-4, 0.0])])
    assert problem is not None and "differs from a fresh compile's (bitwise; max 0.000122" in problem


def test_serial_kernels_hold_openmp_teams_to_one_thread_without_tripping_dynamos_guards():
    import ctypes

    import torch

    omp = ctypes.CDLL("libgomp.so.1")  # torch's CPU build loads it (its own copy, under this soname)
    levels = omp.omp_get_max_active_levels()
    state = torch._C._dynamo.guards.GlobalStateGuard()  # what a compiled frame checks before it runs
    with capture.serial_kernels():
        assert omp.omp_get_max_active_levels() == 0  # even a team of num_threads(N) gets one thread
        # the thread count is among Dynamo's guards: changing it would compile the fresh side again
        assert state.check(), state.reason()
    assert omp.omp_get_max_active_levels() == levels


def test_the_first_step_clock_times_the_first_step_only(monkeypatch):
    monkeypatch.setattr(timing_report, "_FIRST_STEP", [])
    clock = timing_report.first_step_clock()
    assert timing_report.timed_first_step() is None
    clock.on_step_begin(None, None, None)
    clock.on_step_end(None, None, None)
    first = timing_report.timed_first_step()
    assert first is not None and first >= 0
    clock.on_step_begin(None, None, None)
    clock.on_step_end(None, None, None)
    assert timing_report.timed_first_step() == first


def test_a_rehearsal_says_in_one_line_what_its_trace_skip_did_not_keep():
    assert losses.loss_line([{"stored": True}], None) == ""
    assert losses.loss_line([], "a job of 2 processes") == "trace skip off: a job of 2 processes"
    checkpoint = (
        "Unsupported: HOP: Unsafe side effect\n  Explanation: Mutating a variable from outside the scope of this HOP"
        " ... torch.utils.checkpoint.checkpoint ..."
    )
    kernels = (
        "RuntimeError: Function <locals>.Kernelized cannot be saved ... since it's defined in local scope"
    )
    line = losses.loss_line([{"stored": True}, {"stored": False, "reason": checkpoint}], None)
    assert line == (
        "trace not kept for 1 of 2 call(s): torch cannot trace a change of state inside non-reentrant gradient "
        "checkpointing (use_reentrant: false) as one graph (HOP: Unsafe side effect)"
    )
    assert "transformers' hub kernels" in losses.loss_line([{"stored": False, "reason": kernels}], None)
    lora = (
        "Unsupported: returning intermediate with requires_grad_()\n  Explanation: An intermediate tensor ..."
    )
    assert "enable_input_require_grads" in losses.loss_line([{"stored": False, "reason": lora}], None)
    other = losses.loss_line([{"stored": False, "reason": "TypeError: something new\nmore"}], None)
    assert other == "trace not kept for 1 of 1 call(s): TypeError: something new"


class _KernelizedLayer:
    """A backbone with one layer as kernels' `use_kernelized_func` leaves it: its own function instances."""

    def __init__(self, kernelized: bool) -> None:
        if kernelized:
            self._kernel_funcs = {"apply_rotary_pos_emb": object()}

    def modules(self) -> list[_KernelizedLayer]:
        return [self]


def test_a_backbone_using_hub_kernels_is_traced_with_kernels_context_set_once_in_the_forward(monkeypatch):
    from warmup._compat import kernels as compat_kernels

    monkeypatch.setattr(compat_kernels, "TARGETS", ())  # kernels' own names: tests/unit/test_compat.py
    # torch's defaults for a backbone whose layers kernels did not decorate
    assert split.traced_under(_KernelizedLayer(kernelized=False)) is contextlib.nullcontext
    tracing = split.traced_under(_KernelizedLayer(kernelized=True))

    import torch._dynamo.config

    assert not torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint
    with tracing():
        assert torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint
    assert not torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint  # only while it traces


def test_where_torch_lacks_the_setting_a_backbone_using_hub_kernels_is_traced_with_torchs_defaults(
    monkeypatch, caplog
):
    from warmup._compat import kernels as compat_kernels
    from warmup._compat import torch as compat_torch

    monkeypatch.setattr(compat_kernels, "TARGETS", ())
    monkeypatch.setattr(
        compat_torch,
        "checkpoint_side_effects_problem",
        lambda: "torch 9: skip_fwd_side_effects_in_bwd_under_checkpoint is gone",
    )
    with caplog.at_level(logging.WARNING):
        assert split.traced_under(_KernelizedLayer(kernelized=True)) is contextlib.nullcontext
    assert "is gone; a checkpointed model using hub kernels keeps no trace" in caplog.text


def test_a_checkpointed_job_using_hub_kernels_is_said_to_keep_no_trace_only_where_a_seam_fails(monkeypatch):
    from warmup._compat import kernels as compat_kernels
    from warmup._compat import torch as compat_torch

    monkeypatch.setattr(compat_kernels, "installed", lambda: False)
    assert losses.hub_kernels_checkpoint_loss() is None  # no kernels: nothing sets the variable
    monkeypatch.setattr(compat_kernels, "installed", lambda: True)
    monkeypatch.setattr(compat_kernels, "check", lambda: [])
    monkeypatch.setattr(compat_torch, "checkpoint_side_effects_problem", lambda: None)
    assert losses.hub_kernels_checkpoint_loss() is None  # both seams hold: the trace is kept
    monkeypatch.setattr(compat_torch, "checkpoint_side_effects_problem", lambda: "torch 9: it is gone")
    assert losses.hub_kernels_checkpoint_loss() == (
        "torch cannot trace a change of state inside non-reentrant gradient checkpointing (use_reentrant: false) "
        "as one graph (HOP: Unsafe side effect): kernels sets a context variable there (torch 9: it is gone)"
    )
    # the other seam: kernels' own, with torch's holding
    monkeypatch.setattr(compat_kernels, "check", lambda: ["kernels 9: it is gone"])
    monkeypatch.setattr(compat_torch, "checkpoint_side_effects_problem", lambda: None)
    assert (losses.hub_kernels_checkpoint_loss() or "").endswith(
        ": kernels sets a context variable there (kernels 9: it is gone)"
    )


def test_a_recorder_names_why_a_compiled_model_kept_no_trace():
    assert capture.Recorder().lost() is None  # nothing compiled: nothing to say
    sharded = capture.Recorder(off=losses.predicted_loss(world_size=4, sharding="fsdp2"))
    sharded.models = 1
    assert sharded.lost() is not None and sharded.lost().startswith("fsdp2 shards the parameters")
    unsplit = capture.Recorder()
    unsplit.models = 1
    assert unsplit.lost() == losses.NO_BACKBONE
    assert losses.predicted_loss(world_size=1) is None  # a LoRA job's too: its backbone splits


def test_a_training_run_reports_why_its_trace_skip_was_off(tmp_path, monkeypatch):
    state = serve.TraceSkip(tmp_path, off="WARMUP_TRACE_SKIP=0", misses=2)
    state.refuse("not loadable (EOFError)")
    monkeypatch.setattr(serve, "_ACTIVE", [state])
    timings = timing_report.compile_timings()
    assert (timings["served_untraced"], timings["traced"]) == (0, 2)
    assert timings["trace_skip_off"] == "WARMUP_TRACE_SKIP=0"
    assert timings["trace_refused"] == {"not loadable (EOFError)": 1}


def test_warmup_warm_ends_with_the_line_that_says_the_trace_skip_was_lost(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    import yaml

    from warmup.cli import main
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec
    from warmup.rehearsal import local as rehearsal_local
    from warmup.rehearsal.runner import SignatureResult

    spec_path = tmp_path / "job.yaml"
    spec = {
        "trainer": "sft",
        "model": str(tiny_model_dir),
        "target": {"backend": "inductor", "device": "cpu"},
    }
    spec["args"] = {"torch_compile": True, "max_length": 64, "pad_to_multiple_of": 32}
    spec_path.write_text(yaml.safe_dump(spec))
    signatures = plan_spec(load_spec(spec_path)).signatures
    lost = "trace not kept for 1 of 1 call(s): torch cannot trace ..."
    results = [
        SignatureResult(key=s.key(), signature=s, status="ok", trace_lost=lost if i == 0 else "")
        for i, s in enumerate(signatures)
    ]
    report = rehearsal_local.WarmReport(cache_dir=tmp_path / "cache", results=results)
    monkeypatch.setattr(rehearsal_local, "warm_directory", lambda *a, **k: report)
    assert main(["warm", str(spec_path), "--cache-dir", str(tmp_path / "cache")]) in (0, None)
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last == (
        f"trace skip: lost for 1 of {len(signatures)} signature(s): {lost}; training traces those calls with "
        "Dynamo, and the warmed caches serve them"
    )


def test_a_ddp_or_zero2_job_keeps_its_trace_and_a_parameter_sharded_one_says_why_not():
    assert losses.predicted_loss(world_size=4) is None  # DDP: the same backbone graph on every rank
    for mode in ("fsdp2", "fsdp2:ac", "zero3"):
        reason = losses.predicted_loss(world_size=4, sharding=mode)
        assert reason is not None and reason.startswith(f"{mode} shards the parameters"), reason
        assert "Dynamo leaves out of the graph" in reason and "aot_compile" in reason
    assert "FullyShardedDataParallel" in (losses.predicted_loss(world_size=2, sharding="fsdp1") or "")
    # ZeRO-1/2: whole parameters, the model compiled in place and split as DDP's (test_trace_skip_in_place.py)
    assert losses.predicted_loss(world_size=2, sharding="zero2") is None
    assert losses.predicted_loss(world_size=1, sharding="fsdp2") is None  # one process: as before
    sharded = capture.Recorder(off=losses.predicted_loss(world_size=2, sharding="zero3"))
    sharded.models = 1
    assert losses.loss_line([], sharded.lost()).startswith("trace skip off: zero3 shards the parameters")


def test_the_split_reaches_through_ddp_to_the_model_it_replicates():
    import torch
    import torch.distributed as dist

    linear = torch.nn.Linear(2, 2)
    assert split.replicated_module(linear) is linear
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(linear)
        assert split.replicated_module(wrapped) is linear
    finally:
        dist.destroy_process_group()


class _Ranks:
    """torch.distributed's collectives as two ranks see them, played from one: what the other rank gives."""

    def __init__(self, rank: int, made: list[object], outcomes: list[object], refusals: list[object]) -> None:
        self.rank, self.made, self.outcomes, self.refusals = rank, made, outcomes, refusals
        self.given: list[object] = []  # what this rank gave each gather

    def all_gather_object(self, out: list[object], mine: object) -> None:
        given = self.made if not self.given else self.refusals
        self.given.append(mine)
        out[:] = [mine if rank == self.rank else given[rank] for rank in range(len(out))]

    def broadcast_object_list(self, objects: list[object], src: int) -> None:
        if self.rank != src:
            objects[:] = self.outcomes


def _recorded(keys: list[str]) -> capture.Recorder:
    recorder = capture.Recorder()
    recorder.splits = 1
    for key in keys:
        recorder.calls[key] = capture.RecordedCall(
            split.Split(object(), None, None, lambda: None), (), {}, True, True, f"call {key}"
        )
    return recorder


def _stored(cache: Path, key: str) -> capture.CaptureOutcome:
    folder = cache / artifacts.TRACE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}.aot").write_bytes(b"artifact")
    (folder / f"{key}.json").write_text("{}")
    return capture.CaptureOutcome(f"call {key}", True, path=f"{artifacts.TRACE_DIR}/{key}.aot")


def test_rank_zero_keeps_only_the_artifacts_every_rank_made_and_accepted(tmp_path, monkeypatch):
    import torch.distributed as dist

    refused_by_one = "rank 1: value 0 differs from a fresh compile's"
    ranks = _Ranks(
        0, made=[None, (1, ["a", "b", "c"])], outcomes=[], refusals=[None, {"trace/b.aot": refused_by_one}]
    )
    for name in ("all_gather_object", "broadcast_object_list"):
        monkeypatch.setattr(dist, name, getattr(ranks, name))
    monkeypatch.setattr(
        capture, "capture_call", lambda call, cache, exact: _stored(cache, call.description[5:])
    )
    outcomes = _recorded(["a", "b", "d"])._capture_ranks(tmp_path, (0, 2), exact=True)

    by_call = {outcome.description: outcome for outcome in outcomes}
    assert by_call["call a"].stored and (tmp_path / "trace" / "a.aot").is_file()
    assert not by_call["call b"].stored and by_call["call b"].reason == refused_by_one
    assert not (tmp_path / "trace" / "b.aot").exists() and not (tmp_path / "trace" / "b.json").exists()
    assert by_call["call d"].reason.startswith("not made by every rank (not by rank 1)")
    assert by_call["c"].reason.startswith("not made by every rank (not by rank 0)")  # rank 1's only
    assert (tmp_path / "trace" / artifacts.SPLIT_MARKER).is_file()
    assert "trace not kept for 3 of 4 call(s)" in losses.loss_line(
        [dataclasses.asdict(o) for o in outcomes], None
    )


def test_every_other_rank_checks_rank_zeros_artifacts_on_its_own_calls(tmp_path, monkeypatch):
    import torch.distributed as dist

    kept = [
        _stored(tmp_path, "a"),
        _stored(tmp_path, "b"),
        capture.CaptureOutcome("call c", False, reason="x"),
    ]
    ranks = _Ranks(1, made=[(1, ["a", "b", "c"]), None], outcomes=[kept], refusals=[{}, None])
    for name in ("all_gather_object", "broadcast_object_list"):
        monkeypatch.setattr(dist, name, getattr(ranks, name))
    checked = []

    def compare(call: capture.RecordedCall, loaded: object, *, exact: bool) -> str | None:
        checked.append(call.description)
        return (
            "the artifact's guards refuse the very call it was compiled for"
            if call.description == "call b"
            else None
        )

    monkeypatch.setattr(capture, "load_artifact", lambda data, module: data)
    monkeypatch.setattr(capture, "compare", compare)
    monkeypatch.setattr(capture, "capture_call", lambda *a, **k: pytest.fail("only rank 0 compiles"))
    _recorded(["a", "b", "c"])._capture_ranks(tmp_path, (1, 2), exact=True)
    assert checked == ["call a", "call b"]  # each artifact rank 0 kept, on this rank's own call
    assert ranks.given == [
        (1, ["a", "b", "c"]),  # the calls it made
        {
            "trace/b.aot": "rank 1: the artifact's guards refuse the very call it was compiled for"
        },  # its refusals
    ]
    assert (tmp_path / "trace" / "b.aot").is_file()  # rank 0 removes it, with every rank's refusals in hand


def test_a_cache_warmed_off_for_the_jobs_reason_says_that_reason_in_training(tmp_path):
    sharded = losses.predicted_loss(world_size=2, sharding="zero3")
    recorder = capture.Recorder(off=sharded, job_off=True)
    recorder.models = 1
    assert recorder.capture(tmp_path) == []
    assert not (tmp_path / artifacts.TRACE_DIR / artifacts.SPLIT_MARKER).exists()
    state = serve.enable(tmp_path)
    assert state.off == f"the cache was warmed without it: {sharded}"
    assert serve.active() is None
    switched = capture.Recorder(off=f"{split.ENV_VAR}=0")  # the warm-up's own switch: not the job's to say
    switched.models = 1
    assert switched.capture(tmp_path / "switched") == []
    assert serve.enable(tmp_path / "switched").off == "the cache was warmed without it"


def test_a_rehearsal_of_a_sharded_job_records_nothing_and_says_it_is_the_jobs_reason(monkeypatch):
    monkeypatch.setattr(
        capture, "unavailable_reason", lambda: None
    )  # a torch with the mechanism, switched on
    recorder = capture.start_recording(2, "fsdp2")
    split.remove_hook(recorder.wrap)
    assert recorder.job_off and recorder.off == losses.predicted_loss(world_size=2, sharding="fsdp2")
    monkeypatch.setattr(capture, "unavailable_reason", lambda: f"{split.ENV_VAR}=0")
    recorder = capture.start_recording(2, "fsdp2")
    split.remove_hook(recorder.wrap)
    assert not recorder.job_off and recorder.off == f"{split.ENV_VAR}=0"


def test_a_rank_zero_capture_that_fails_joins_every_collective_before_it_fails(tmp_path, monkeypatch):
    import torch.distributed as dist

    ranks = _Ranks(0, made=[None, (1, ["a"])], outcomes=[], refusals=[None, {}])
    monkeypatch.setattr(dist, "all_gather_object", ranks.all_gather_object)
    broadcast: list[object] = []
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: broadcast.append(list(objects)))

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(capture, "_mark_split", fail)
    with pytest.raises(OSError, match="disk full"):
        _recorded(["a"])._capture_ranks(tmp_path, (0, 2), exact=True)
    assert (
        broadcast == [[[]]] and len(ranks.given) == 2
    )  # rank 1 got no artifact to check, and was not left waiting
