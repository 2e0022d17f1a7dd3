"""GRPO / RLOO / Distillation plans without running a trainer: warnings, refusals, world-size effects, CLI."""

from __future__ import annotations

import json

import pytest

from tests.support.tiny_model import write_tiny_model
from warmup.cli import main
from warmup.errors import EmptyPlanError
from warmup.job.spec import load_spec
from warmup.planner.planning import estimate_seconds, plan_spec

NEURON = {"backend": "neuron", "device": "neuron"}
INDUCTOR = {"backend": "inductor", "device": "cpu"}
FACTS = {"min_prompt_tokens": 40, "max_prompt_tokens": 300}  # prompt buckets 128, 256, 384 on Neuron
BF16 = {"model_init_kwargs": {"dtype": "bfloat16"}}


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("teacher"), layers=3)


def make_plan(model_dir, trainer="grpo", args=None, data=None, target=None, teacher=None):
    spec = {
        "trainer": trainer,
        "model": str(model_dir),
        "args": {
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "max_completion_length": 200,
            **(args or {}),
        },
        "data": FACTS if data is None else data,
        "target": target or NEURON,
    }
    if trainer == "rloo":
        spec["args"].pop("num_generations")
    if trainer == "distillation":
        spec["args"].pop("num_generations")
        spec["teacher_model"] = str(teacher)
    return plan_spec(load_spec(spec))


def shapes(plan, phase):
    return {(s.batch, s.seq_len, s.cache_len) for s in plan.signatures if s.phase == phase}


def warned(plan, text):
    return any(text in warning for warning in plan.warnings)


# --- generation and the static cache --------------------------------------------------------------


def test_pinned_static_cache_is_one_size_and_no_cache_advice(tiny_model_dir):
    pin = 384 + 200 - 1
    plan = make_plan(
        tiny_model_dir,
        args={**BF16, "cache_implementation": "static", "generation_kwargs": {"max_cache_len": pin}},
    )
    assert {c for _, _, c in shapes(plan, "generate_decode")} == {pin}
    assert shapes(plan, "generate_prefill") == {(4, p, pin) for p in (128, 256, 384)}
    assert not warned(plan, "ratchets") and not warned(plan, "dynamic")


def test_unpinned_static_cache_lists_the_ratchet_and_says_how_to_pin(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args={**BF16, "cache_implementation": "static"})
    sizes = {327, 455, 583}  # P + M - 1 for P in 128, 256, 384
    assert {c for _, _, c in shapes(plan, "generate_decode")} == sizes
    # The prefill runs against the ratcheted cache: any size at least its own.
    assert shapes(plan, "generate_prefill") == {
        (4, 128, 327), (4, 128, 455), (4, 128, 583), (4, 256, 455), (4, 256, 583), (4, 384, 583)
    }  # fmt: skip
    assert warned(plan, "max_cache_len: 583")


def test_dynamic_cache_lists_prefill_only_and_warns_with_the_fix(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args=BF16)
    assert shapes(plan, "generate_prefill") == {(4, p, None) for p in (128, 256, 384)}
    assert not shapes(plan, "generate_decode")
    assert warned(plan, "cache_implementation: static and generation_kwargs: {max_cache_len: 583}")


def test_dynamic_cache_is_no_concern_under_inductor(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args={"torch_compile": True}, target=INDUCTOR)
    assert not warned(plan, "dynamic KV cache")
    generate = [s for s in plan.signatures if s.phase.startswith("generate_")]
    assert generate and all(s.compile == "eager" and estimate_seconds(s, "inductor") == 0 for s in generate)


def test_float32_weights_with_autocast_and_a_static_cache_warn_on_neuron(tiny_model_dir):
    static = {"cache_implementation": "static"}
    assert warned(make_plan(tiny_model_dir, args=static), "different dtypes")
    assert not warned(make_plan(tiny_model_dir, args={**static, **BF16}), "different dtypes")
    assert not warned(make_plan(tiny_model_dir, args={**static, "bf16": False}), "different dtypes")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"use_transformers_continuous_batching": True}, "continuous_batching"),
        ({"generation_kwargs": {"use_cache": False}}, "use_cache is false"),
        ({"generation_kwargs": {"num_beams": 2}}, "num_beams"),
        ({"generation_kwargs": {"prefill_chunk_size": 64}}, "prefill_chunk_size"),
        ({"cache_implementation": "paged"}, "not a static or dynamic cache"),
    ],
)
def test_generation_that_cannot_be_listed_warns_and_keeps_training_shapes(tiny_model_dir, args, message):
    plan = make_plan(tiny_model_dir, args={**BF16, **args})
    assert warned(plan, message)
    assert not shapes(plan, "generate_prefill") and not shapes(plan, "generate_decode")
    assert shapes(plan, "train")


def test_vllm_lists_training_with_the_importance_sampling_old_logps(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args={**BF16, "use_vllm": True})
    assert warned(plan, "use_vllm")
    assert not shapes(plan, "generate_prefill")
    assert shapes(plan, "old_logps") == shapes(plan, "train")  # GA 1 = spg: only vLLM's correction needs them
    plan = make_plan(
        tiny_model_dir, args={**BF16, "use_vllm": True, "vllm_importance_sampling_correction": False}
    )
    assert not shapes(plan, "old_logps")


def test_generation_length_comes_from_generation_kwargs(tiny_model_dir):
    plan = make_plan(
        tiny_model_dir,
        args={
            **BF16,
            "cache_implementation": "static",
            "generation_kwargs": {"max_new_tokens": 100, "min_new_tokens": 150},
        },
    )
    # M = 100 (max_new_tokens wins over max_completion_length); min_new_tokens is capped at M.
    assert {c for _, _, c in shapes(plan, "generate_decode")} == {227, 355, 483}
    assert {seq for _, seq, _ in shapes(plan, "train")} == {256, 384, 512}


def test_min_new_tokens_raises_the_smallest_completion_bucket(tiny_model_dir):
    args = {**BF16, "max_completion_length": 400}
    free = make_plan(tiny_model_dir, args=args)
    held = make_plan(tiny_model_dir, args={**args, "generation_kwargs": {"min_new_tokens": 200}})
    assert min(seq for _, seq, _ in shapes(free, "train")) == 128 + 128  # one-token completions pad to 128
    assert min(seq for _, seq, _ in shapes(held, "train")) == 128 + 256


# --- unbounded lengths ---------------------------------------------------------------------------


def test_unbounded_prompts_or_completions_are_refused_naming_the_missing_fact(tiny_model_dir):
    """A GRPO job compiles: a plan of nothing would warm nothing and pass, so it is an error naming the fact."""
    with pytest.raises(EmptyPlanError) as no_prompts:
        make_plan(tiny_model_dir, args=BF16, data={})
    assert [p.loc for p in no_prompts.value.problems] == ["data.max_prompt_tokens"]
    assert "--dataset PATH" in str(no_prompts.value)
    with pytest.raises(EmptyPlanError) as unbounded:
        make_plan(tiny_model_dir, args={**BF16, "max_completion_length": None})
    assert [p.loc for p in unbounded.value.problems] == ["args.max_completion_length"]


def test_max_tokens_bounds_the_prompts_when_max_prompt_tokens_is_missing(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args=BF16, data={"max_tokens": 200})
    assert {seq for _, seq, _ in shapes(plan, "generate_prefill")} == {128, 256}


def test_tool_calling_is_flagged(tiny_model_dir, teacher_dir):
    assert warned(make_plan(tiny_model_dir, args={**BF16, "max_tool_calling_iterations": 3}), "tool")
    plan = make_plan(
        tiny_model_dir, "distillation", args={**BF16, "max_tool_calling_iterations": 3}, teacher=teacher_dir
    )
    assert warned(plan, "tool")


# --- the forward-only passes and eval --------------------------------------------------------------


def test_grpo_reference_and_eval_batches(tiny_model_dir):
    args = {
        **BF16,
        "beta": 0.04,
        "eval_strategy": "steps",
        "per_device_eval_batch_size": 8,
        "num_generations_eval": 2,
    }
    plan = make_plan(tiny_model_dir, args=args, data={**FACTS, "num_eval_examples": 5})
    # 5 prompts x 2 generations = 10 rows: eval batches of 8 and 2.
    assert {b for b, _, _ in shapes(plan, "eval")} == {8, 2}
    assert {b for b, _, _ in shapes(plan, "ref")} == {4, 8, 2}
    assert {b for b, _, _ in shapes(plan, "generate_prefill")} == {4, 8, 2}
    assert shapes(plan, "eval") and not shapes(plan, "old_logps")


def test_eval_without_an_example_count_warns_about_the_last_batch(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args={**BF16, "eval_strategy": "epoch", "per_device_eval_batch_size": 8})
    assert warned(plan, "data.num_eval_examples")
    assert {b for b, _, _ in shapes(plan, "eval")} == {8}


def test_rloo_runs_old_logps_and_reference_by_default(tiny_model_dir):
    plan = make_plan(tiny_model_dir, "rloo", args=BF16)
    assert shapes(plan, "old_logps") == shapes(plan, "ref") == shapes(plan, "train")
    plan = make_plan(tiny_model_dir, "rloo", args={**BF16, "beta": 0.0})
    assert not shapes(plan, "ref") and shapes(plan, "old_logps")


def test_reference_uses_log_probs_only_and_train_carries_the_loss(tiny_model_dir):
    plan = make_plan(tiny_model_dir, args={**BF16, "beta": 0.1, "loss_type": "grpo", "temperature": 0.7})
    train = next(s for s in plan.signatures if s.phase == "train")
    ref = next(s for s in plan.signatures if s.phase == "ref")
    assert train.settings["loss_type"] == "grpo" and train.settings["temperature"] == 0.7
    assert train.gradient_checkpointing and not ref.gradient_checkpointing
    assert ref.settings["lm_head_outputs"] == "log_probs" and "loss_type" not in ref.settings


@pytest.mark.parametrize(
    ("trainer", "peft", "compiled"),
    [
        ("grpo", None, {"train", "ref"}),  # the reference copy is prepared (compiled) at init
        ("grpo", {"lora_r": 8}, {"train"}),  # PEFT: the reference is the bare policy, adapter disabled
        ("rloo", None, {"train", "ref"}),
    ],
)
def test_under_inductor_only_the_wrapped_policy_and_the_reference_copy_compile(
    tiny_model_dir, trainer, peft, compiled
):
    args = {
        **BF16,
        "beta": 0.1,
        "steps_per_generation": 2,  # GA 1 % 2 != 0: GRPO computes old log-probs (RLOO always does)
        "eval_strategy": "steps",
        "pad_to_multiple_of": 128,
        "torch_compile": True,
    }
    spec = {
        "trainer": trainer,
        "model": str(tiny_model_dir),
        "args": {"per_device_train_batch_size": 4, "max_completion_length": 200, **args},
        "data": {**FACTS, "num_eval_examples": 4},
        "target": INDUCTOR,
    }
    if peft:
        spec["peft"] = peft
    plan = plan_spec(load_spec(spec))
    listed = {s.phase for s in plan.signatures}
    assert listed == {"train", "old_logps", "ref", "eval", "generate_prefill"}  # all listed (dynamic cache)
    assert {s.phase for s in plan.signatures if s.compile != "eager"} == compiled


# --- world size ------------------------------------------------------------------------------------


def test_world_size_changes_steps_per_generation_and_the_old_logps_rule(tiny_model_dir):
    args = {**BF16, "generation_batch_size": 16, "gradient_accumulation_steps": 2}
    one = make_plan(tiny_model_dir, args=args)
    two = make_plan(tiny_model_dir, args=args, target={**NEURON, "world_size": 2})
    # One process: steps_per_generation 4, 16-row generation batch, and 2 % 4 != 0 brings the old log-probs.
    assert {b for b, _, _ in shapes(one, "generate_prefill")} == {16} and shapes(one, "old_logps")
    # Two: steps_per_generation 2, 8 rows per process, 2 % 2 == 0.
    assert {b for b, _, _ in shapes(two, "generate_prefill")} == {8} and not shapes(two, "old_logps")
    assert {s.world_size for s in two.signatures} == {2}


def test_several_processes_have_no_short_eval_batch(tiny_model_dir):
    args = {**BF16, "eval_strategy": "steps", "per_device_eval_batch_size": 8}
    plan = make_plan(
        tiny_model_dir, args=args, data={**FACTS, "num_eval_examples": 5}, target={**NEURON, "world_size": 2}
    )
    assert {b for b, _, _ in shapes(plan, "eval")} == {8}


# --- distillation ---------------------------------------------------------------------------------


def test_distillation_generates_for_batch_times_accumulation_and_runs_the_teacher(
    tiny_model_dir, teacher_dir
):
    args = {
        **BF16,
        "gradient_accumulation_steps": 3,
        "cache_implementation": "static",
        "teacher_model_init_kwargs": {"dtype": "bfloat16"},
    }
    plan = make_plan(tiny_model_dir, "distillation", args=args, teacher=teacher_dir)
    assert {b for b, _, _ in shapes(plan, "generate_prefill")} == {12}
    assert shapes(plan, "teacher") == shapes(plan, "train")
    teacher = next(s for s in plan.signatures if s.phase == "teacher")
    assert teacher.dtype == "bfloat16" and not teacher.gradient_checkpointing
    assert not shapes(plan, "ref") and not shapes(plan, "old_logps")


# --- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer", ["grpo", "rloo", "distillation"])
def test_warmup_plan_prints_a_table_and_json(tiny_model_dir, teacher_dir, tmp_path, capsys, trainer):
    spec = {
        "trainer": trainer,
        "model": str(tiny_model_dir),
        "args": {**BF16, "max_completion_length": 200, "cache_implementation": "static"},
        "data": FACTS,
        "target": NEURON,
    }
    if trainer == "distillation":
        spec["teacher_model"] = str(teacher_dir)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["plan", str(path)]) == 0
    table = capsys.readouterr().out
    assert "generate_decode" in table and "signature(s)" in table
    assert main(["plan", str(path), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {s["phase"] for s in document["signatures"]} >= {"train", "generate_prefill", "generate_decode"}
    assert any("ratchets" in warning for warning in document["warnings"])
