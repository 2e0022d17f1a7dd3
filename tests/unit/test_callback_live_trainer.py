"""The callback never breaks the run it watches (issue 35, trap 0): built while a trainer's Accelerator is live
(`trainer.add_callback(WarmupCallback(...))` on a built trainer), its planning leaves accelerate's shared state
as the trainer made it; and when the run's arguments are not the spec's, it says so rather than blame the data.

In process: a real Accelerator and TRL's real config classes, no training (tests/integration/
test_callback_attach.py trains with the callback attached each way; tests/e2e/test_pull_pod.py with compiles).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.tiny_model import write_tiny_model
from warmup.diagnosis import RunFacts, args_differences, diagnose
from warmup.job.spec import Spec, load_spec
from warmup.planner.planning import plan_spec


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Spec:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    args = {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32, "bf16": False}
    return load_spec(
        {
            "trainer": "sft",
            "model": str(model),
            "args": {**args, "torch_compile": True},
            "data": {"min_tokens": 10, "max_tokens": 30},
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )


@pytest.fixture
def live_accelerator() -> Iterator[object]:
    """An Accelerator as a built Trainer holds one; the process's accelerate state is put back afterwards."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    before = [(owner._shared_state, dict(owner._shared_state)) for owner in (PartialState, AcceleratorState)]
    AcceleratorState._reset_state(reset_partial_state=True)
    yield Accelerator(cpu=True)
    for shared, state in before:
        shared.clear()
        shared.update(state)


def test_building_the_callback_under_a_live_accelerator_keeps_its_state(spec, live_accelerator, tmp_path):
    from accelerate.state import AcceleratorState

    from warmup.pod.callback.observer import WarmupCallback

    accelerator = live_accelerator
    before = (accelerator.state.distributed_type, accelerator.device, accelerator.num_processes)
    callback = WarmupCallback(spec, cache_dir=tmp_path / "cache")  # plans: builds TRL's SFTConfig
    assert callback._planned  # the plan was made (through TRL's config class), not skipped
    state = AcceleratorState()
    assert (state.distributed_type, accelerator.device, accelerator.num_processes) == before
    assert accelerator.state.distributed_type == before[0]


def test_planning_without_a_live_state_still_sets_up_the_configs_devices(spec):
    """Outside a training process (the service, the CLI) nothing is kept: TRL's config sets its devices up."""
    from accelerate.state import AcceleratorState, PartialState

    from warmup.job.trl_args import resolve_trainer_args

    AcceleratorState._reset_state(reset_partial_state=True)
    args = resolve_trainer_args(spec)
    assert PartialState._shared_state and str(args.config.device) == "cpu"


def test_a_run_with_another_batch_size_is_named_not_blamed_on_the_data(spec):
    import trl

    run_args = trl.SFTConfig(
        output_dir="unused", per_device_train_batch_size=4, max_length=64, pad_to_multiple_of=32, use_cpu=True
    )
    differs = args_differences(spec.args, run_args)
    assert differs == {"per_device_train_batch_size": (2, 4)}
    planned = plan_spec(spec).signatures
    (warm,) = planned
    diagnosis = diagnose(
        ("train", 4, 32),
        warm.model_copy(update={"batch": 4}),
        planned,
        RunFacts(args=differs),
        planned=False,
    )
    assert "the run's arguments differ from the spec's: per_device_train_batch_size 4 (the spec: 2)" in (
        diagnosis.cause
    )
    assert "data facts" not in diagnosis.sentence()
    assert diagnosis.as_json()["args"] == {"per_device_train_batch_size": {"spec": 2, "run": 4}}


def test_the_spec_s_own_arguments_differ_in_nothing(spec):
    import trl

    same = trl.SFTConfig(
        output_dir="unused", per_device_train_batch_size=2, max_length=64, pad_to_multiple_of=32, use_cpu=True
    )
    assert args_differences(spec.args, same) == {}
    # a field the spec leaves out is TRL's default on both sides
    assert args_differences({}, trl.SFTConfig(output_dir="unused", use_cpu=True)) == {}
    # `auto` is resolved by TRL on the device: not a difference the callback can name
    assert args_differences({**spec.args, "pad_to_multiple_of": "auto"}, same) == {}
