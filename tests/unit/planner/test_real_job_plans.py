"""Plans of the jobs issue 13 made warmable, without running a trainer: packed and padding-free SFT, the LoRA
block, vLLM generation (the TRL-truth runs of the same configurations are in test_sft_truth.py and
test_peft_truth.py; the zero-compile proofs in tests/e2e/test_zero_compile_jobs.py)."""

from __future__ import annotations

import json

import pytest

from tests.unit.planner.test_preference_plans import CPU, QWEN3, shapes
from warmup.errors import SpecError
from warmup.job.spec import load_spec
from warmup.planner.planning import plan_spec
from warmup.signature import Plan


@pytest.fixture
def model(tmp_path):
    def write() -> str:
        directory = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(QWEN3))
        return str(directory)

    return write


WRAPPED = {"per_device_train_batch_size": 4, "max_length": 64, "packing": True, "packing_strategy": "wrapped"}


def make(trainer: str, model_dir: str, args: dict, data: dict | None = None, **spec: object) -> Plan:
    return plan_spec(
        load_spec(
            {
                "trainer": trainer,
                "model": model_dir,
                "args": {"pad_to_multiple_of": 16, **args},
                "data": data or {},
                "target": CPU,
                **spec,
            }
        )
    )


def test_wrapped_packing_without_a_row_count_lists_every_last_batch(model):
    plan = make("sft", model(), WRAPPED)
    # full batches of 64-wide rows; a last batch of 1, 2 or 3 rows; a one-row batch may be the remainder row
    assert shapes(plan) == {("train", b, 64) for b in (4, 3, 2, 1)} | {("train", 1, w) for w in (16, 32, 48)}
    assert any("every size its last batch" in note for note in plan.notes)


def test_wrapped_packing_with_the_packed_row_count_lists_the_one_last_batch(model):
    # warmup facts counts packed rows (num_train_rows) when packing: 10 rows of batches of 4 end on 2
    plan = make("sft", model(), WRAPPED, {"num_train_rows": 10, "min_tokens": 5, "max_tokens": 30})
    assert shapes(plan) == {("train", 4, 64), ("train", 2, 64)}
    assert not any("last batch" in note for note in plan.notes)


def test_wrapped_packing_with_a_histogram_lists_batches_of_remainder_rows(model):
    # 9 packed rows: 7 full, two remainders (two map batches) of 20 and 40 tokens; last batch 9 % 4 = 1
    facts = {"num_train_rows": 9, "length_histogram": {64: 7, 20: 1, 40: 1}}
    plan = make("sft", model(), WRAPPED, facts)
    assert shapes(plan) == {("train", 4, 64), ("train", 1, 64), ("train", 1, 32), ("train", 1, 48)}


def test_wrapped_packing_with_drop_last_lists_only_full_batches(model):
    plan = make("sft", model(), {**WRAPPED, "dataloader_drop_last": True})
    assert shapes(plan) == {("train", 4, 64)}


def test_padding_free_without_packing_needs_max_length_null_and_is_planned_then(model):
    with pytest.raises(SpecError, match="max_length: null"):
        make("sft", model(), {"padding_free": True, "max_length": 64})
    plan = make(
        "sft",
        model(),
        {"padding_free": True, "max_length": None, "per_device_train_batch_size": 2},
        {"min_tokens": 10, "max_tokens": 40},
    )
    # two untruncated rows of 10..40 tokens concatenated into one: 10..80, padded to 16
    assert shapes(plan) == {("train", 1, w) for w in (16, 32, 48, 64, 80)}
    assert all(s.settings["padding_free"] for s in plan.signatures)


def test_a_peft_block_is_checked_as_trl_reads_it(model):
    with pytest.raises(SpecError) as raised:
        make("sft", model(), {"max_length": 32}, peft={"lora_rank": 8})
    assert raised.value.problems[0].loc == "peft.lora_rank" and "lora_r" in raised.value.problems[0].msg
    plan = make("sft", model(), {"max_length": 32}, peft={"lora_r": 8, "lora_target_modules": ["q_proj"]})
    assert all(s.frozen for s in plan.signatures)


def test_lora_config_is_the_one_trl_scripts_build():
    from trl import ModelConfig, get_peft_config

    from warmup.job.peft_args import lora_config

    settings = {
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_target_modules": ["q_proj", "v_proj"],
        "lora_modules_to_save": ["lm_head"],
    }
    ours = lora_config(settings)
    trls = get_peft_config(ModelConfig(use_peft=True, **settings))
    assert ours.to_dict() == trls.to_dict()
    assert (
        ours.r == 8
        and set(ours.target_modules) == {"q_proj", "v_proj"}
        and ours.modules_to_save == ["lm_head"]
    )


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_vllm_generation_lists_the_trainer_forwards_and_labels_vllms_cache_unverified(model, mode):
    args = {
        "per_device_train_batch_size": 2,
        "num_generations": 2,
        "max_completion_length": 8,
        "use_vllm": True,
        "vllm_mode": mode,
        "torch_compile": True,
    }
    plan = make("grpo", model(), args, {"max_prompt_tokens": 14})
    assert {s.phase for s in plan.signatures} == {
        "train",
        "old_logps",
    }  # vLLM importance sampling: old log-probs
    assert any("vLLM's own compile cache is a separate artifact set, unverified" in w for w in plan.warnings)


def test_the_rehearsal_generates_through_transformers_where_vllm_cannot_run(model, tmp_path):
    """No vLLM on this machine: the rehearsal's config turns use_vllm off (the training graphs are the same)."""
    import importlib.util

    from warmup.rehearsal.drivers import RunJob, build_config
    from warmup.rehearsal.units import RehearsalUnit

    assert importlib.util.find_spec("vllm") is None, "vLLM is installed here: this test is about its absence"
    spec = load_spec(
        {
            "trainer": "grpo",
            "model": model(),
            "args": {
                "use_vllm": True,
                "num_generations": 2,
                "per_device_train_batch_size": 2,
                "use_cpu": True,
                "bf16": False,
            },
            "target": CPU,
        }
    )
    unit = RehearsalUnit(index=0, kind="train", batch=2, seq_len=32, signatures=[])
    config = build_config(RunJob(spec, [unit], tmp_path / "cache", tmp_path / "work", 1))
    assert config.use_vllm is False


def test_compiled_old_log_probs_of_a_vllm_job_are_refused_where_vllm_cannot_run(model, tmp_path):
    """On Neuron the old log-probs compile; without vLLM the rehearsal would not produce them (GRPO computes
    them every round only for vLLM's importance sampling): refused, never published as warmed."""
    from warmup.errors import RehearsalError
    from warmup.rehearsal.drivers import RunJob, _refuse_old_logps_without_vllm, build_config
    from warmup.rehearsal.units import RehearsalUnit
    from warmup.signature import Signature

    spec = load_spec(
        {
            "trainer": "grpo",
            "model": model(),
            "args": {
                "use_vllm": True,
                "num_generations": 2,
                "per_device_train_batch_size": 2,
                "use_cpu": True,
            },
            "target": CPU,
        }
    )

    def unit(compile_label: str) -> RehearsalUnit:
        old = Signature(
            phase="old_logps",
            batch=2,
            seq_len=32,
            trainer="grpo",
            model="m",
            dtype="float32",
            compile=compile_label,
        )
        return RehearsalUnit(index=0, kind="train", batch=2, seq_len=32, signatures=[old])

    job = RunJob(spec, [unit("neuron")], tmp_path / "cache", tmp_path / "work", 1)
    config = build_config(job)
    with pytest.raises(RehearsalError, match="importance-sampling"):
        _refuse_old_logps_without_vllm(job, config)
    _refuse_old_logps_without_vllm(
        RunJob(spec, [unit("eager")], tmp_path, tmp_path, 1), config
    )  # nothing to warm
