"""The compile-label rule: every pass is listed; which module TRL calls (`runs_on`) decides whether it compiles.

The truth tests show per trainer which passes torch.compile compiles; these check the rule itself and what
reads the labels: estimates and the Dynamo recompile-limit warning.
"""

from __future__ import annotations

import pytest

from warmup.job.model_facts import read_model_facts
from warmup.job.spec import load_spec
from warmup.job.trl_args import resolve_trainer_args
from warmup.planner.common import PlanBuilder
from warmup.planner.planning import estimate_seconds, plan_spec

INDUCTOR = {"backend": "inductor", "device": "cpu"}
NEURON = {"backend": "neuron", "device": "neuron"}


def builder(model_dir, args: dict, target: dict) -> PlanBuilder:
    spec = load_spec({"trainer": "grpo", "model": str(model_dir), "args": args, "target": target})
    return PlanBuilder(spec=spec, args=resolve_trainer_args(spec), model=read_model_facts(spec.model))


@pytest.mark.parametrize(
    ("args", "target", "labels"),
    [
        # torch_compile on under Inductor: only the module accelerate wrapped goes through Dynamo.
        ({"torch_compile": True}, INDUCTOR, {"wrapped": "inductor", "bare": "eager", "generate": "eager"}),
        (
            {"torch_compile": True, "torch_compile_mode": "max-autotune"},
            INDUCTOR,
            {"wrapped": "inductor:max-autotune", "bare": "eager", "generate": "eager"},
        ),
        ({}, INDUCTOR, {"wrapped": "eager", "bare": "eager", "generate": "eager"}),  # no torch.compile at all
        # TorchNeuron compiles eager ops too: every pass compiles, with torch_compile or without.
        ({"torch_compile": True}, NEURON, {"wrapped": "neuron", "bare": "neuron", "generate": "neuron"}),
        ({}, NEURON, {"wrapped": "neuron", "bare": "neuron", "generate": "neuron"}),
    ],
)
def test_label_follows_the_module_the_pass_runs_on(tiny_model_dir, args, target, labels):
    plan = builder(tiny_model_dir, args, target)
    plan.add("train", 2, 32, runs_on="wrapped")
    plan.add("eval", 2, 32, runs_on="bare")
    plan.add("generate_decode", 2, 1, 64, runs_on="generate")
    by_phase = {s.phase: s.compile for s in plan.build().signatures}
    assert by_phase == {
        "train": labels["wrapped"],
        "eval": labels["bare"],
        "generate_decode": labels["generate"],
    }
    # Every pass is listed; Dynamo traces exactly the wrapped one when torch_compile is on.
    expected_dynamo = {"train"} if "torch_compile" in args else set()
    assert {plan.signatures[key].phase for key in plan.dynamo_keys} == expected_dynamo


def test_generate_phases_and_runs_on_generate_go_together(tiny_model_dir):
    plan = builder(tiny_model_dir, {}, INDUCTOR)
    with pytest.raises(ValueError, match="generate"):
        plan.add("generate_prefill", 2, 32, 64)
    with pytest.raises(ValueError, match="generate"):
        plan.add("train", 2, 32, runs_on="generate")


def sft_plan(model_dir, args: dict, target: dict, data: dict):
    spec = load_spec(
        {
            "trainer": "sft",
            "model": str(model_dir),
            "args": {"bf16": False, **args},
            "data": data,
            "target": target,
        }
    )
    return plan_spec(spec)


# Eval rows reach 16 buckets of 16 tokens; train rows (packed to max_length) only one.
EVAL_HEAVY = {
    "max_length": 256,
    "pad_to_multiple_of": 16,
    "packing": True,
    "packing_strategy": "wrapped",
    "eval_packing": False,
    "dataloader_drop_last": True,
    "eval_strategy": "epoch",
    "per_device_eval_batch_size": 1,
    "torch_compile": True,
}
EVAL_FACTS = {"min_tokens": 1, "max_tokens": 256, "num_eval_examples": 4}


@pytest.mark.parametrize("target", [INDUCTOR, NEURON])
def test_recompile_limit_counts_only_what_dynamo_traces(tiny_model_dir, target):
    """Evaluation calls the bare policy: its many shapes never reach Dynamo, on either backend."""
    plan = sft_plan(tiny_model_dir, EVAL_HEAVY, target, EVAL_FACTS)
    assert len([s for s in plan.signatures if s.phase == "eval"]) == 16
    assert not any("recompile_limit" in warning for warning in plan.warnings)
    unpacked = sft_plan(tiny_model_dir, {**EVAL_HEAVY, "packing": False}, target, EVAL_FACTS)
    assert any("16 signatures compile" in warning for warning in unpacked.warnings)  # the 16 train shapes


def test_an_unpadded_job_with_many_compiled_lengths_is_told_to_pad(tiny_model_dir):
    """Off Neuron TRL's pad_to_multiple_of defaults to none: each batch length compiles on its own."""
    args = {"max_length": 256, "torch_compile": True}

    def unpadded_warnings(plan) -> list[str]:
        return [warning for warning in plan.warnings if "pad_to_multiple_of is unset" in warning]

    many = sft_plan(tiny_model_dir, args, INDUCTOR, {"min_tokens": 20, "max_tokens": 200})
    assert unpadded_warnings(many) == [
        "pad_to_multiple_of is unset (TRL's default off Neuron), so every batch length compiles on its own: 181 "
        "lengths from 20 to 200; set pad_to_multiple_of to make them few (`warmup advise` ranks the settings by "
        "projected compile plus training time)"
    ]
    few = sft_plan(tiny_model_dir, args, INDUCTOR, {"min_tokens": 20, "max_tokens": 27})  # 8 lengths
    padded = sft_plan(
        tiny_model_dir, {**args, "pad_to_multiple_of": 64}, INDUCTOR, {"min_tokens": 20, "max_tokens": 200}
    )
    eager = sft_plan(tiny_model_dir, {"max_length": 256}, INDUCTOR, {"min_tokens": 20, "max_tokens": 200})
    on_neuron = sft_plan(tiny_model_dir, args, NEURON, {"min_tokens": 20, "max_tokens": 200})  # "auto" is 128
    assert len(few.signatures) == 8 and len(padded.signatures) == 4 and len(eager.signatures) == 181
    assert not any(map(unpadded_warnings, [few, padded, eager, on_neuron]))


def test_eager_signatures_cost_nothing_under_inductor(tiny_model_dir):
    plan = sft_plan(tiny_model_dir, EVAL_HEAVY, INDUCTOR, EVAL_FACTS)
    train = [s for s in plan.signatures if s.phase == "train"]
    evals = [s for s in plan.signatures if s.phase == "eval"]
    assert {s.compile for s in train} == {"inductor"} and {s.compile for s in evals} == {"eager"}
    assert all(estimate_seconds(s, "inductor") > 0 for s in train)
    assert all(estimate_seconds(s, "inductor") == 0 for s in evals)


def test_a_torch_compile_job_that_compiles_nothing_says_so(tmp_path_factory, tiny_model_dir):
    from tests.support.tiny_model import write_tiny_model

    teacher = write_tiny_model(tmp_path_factory.mktemp("teacher"), layers=3)

    def distillation(args: dict, target: dict):
        spec = {
            "trainer": "distillation",
            "model": str(tiny_model_dir),
            "teacher_model": str(teacher),
            "args": {"bf16": False, "max_completion_length": 8, **args},
            "data": {"max_prompt_tokens": 16},
            "target": target,
        }
        return plan_spec(load_spec(spec))

    compiled = distillation({"torch_compile": True}, INDUCTOR)
    assert compiled.signatures and {s.compile for s in compiled.signatures} == {"eager"}
    assert any("no module through the torch.compile wrapper" in warning for warning in compiled.warnings)
    assert not any(
        "no module through the torch.compile wrapper" in w
        for w in distillation({"torch_compile": True}, NEURON).warnings
    )
    assert not any(
        "no module through the torch.compile wrapper" in w for w in distillation({}, INDUCTOR).warnings
    )  # warned otherwise


def test_a_compiled_job_whose_warm_up_keeps_no_trace_is_warned_of(tiny_model_dir):
    def warnings(target: dict, **extra: object) -> list[str]:
        spec = {"trainer": "sft", "model": str(tiny_model_dir), "target": target, **extra}
        spec["args"] = {
            "torch_compile": True,
            "max_length": 64,
            "pad_to_multiple_of": 32,
            **spec.get("args", {}),
        }
        return [w for w in plan_spec(load_spec(spec)).warnings if w.startswith("trace skip:")]

    assert warnings(INDUCTOR) == []
    # a LoRA model's backbone splits and keeps its trace, checkpointed or not
    assert warnings(INDUCTOR, peft={"lora_r": 8}) == []
    assert warnings(INDUCTOR, peft={"lora_r": 8}, args={"gradient_checkpointing": False}) == []
    assert warnings({**INDUCTOR, "world_size": 4}) == []  # DDP: every rank runs the same backbone graph
    sharded = {"accelerate_config": "fsdp2", "use_cpu": True}
    (fsdp,) = warnings({**INDUCTOR, "world_size": 8}, args=sharded)
    assert fsdp.startswith("trace skip: fsdp2 shards the parameters") and "aot_compile" in fsdp, fsdp

    # ZeRO-1/2 keep whole parameters: DeepSpeed's engine compiles the model in place, split and served as DDP's
    def deepspeed(preset: str) -> list[str]:
        return warnings({**INDUCTOR, "world_size": 8}, args={"accelerate_config": preset, "use_cpu": True})

    assert deepspeed("zero1") == deepspeed("zero2") == []
    (zero3,) = deepspeed("zero3")
    assert zero3.startswith("trace skip: zero3 shards the parameters"), zero3
    assert warnings(INDUCTOR, peft={"lora_r": 8}, args={"torch_compile": False}) == []  # nothing traced
