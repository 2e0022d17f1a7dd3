"""LoRA (PEFT) plans against TRL itself, for every trainer that takes `peft_config`: SFT, DPO, KTO, Reward, GRPO
and RLOO.

Each job runs TRL's real trainer with the `LoraConfig` TRL's scripts build from the spec's `peft` block
(`warmup.job.peft_args.lora_config`), under torch.compile with Dynamo's cheap eager backend. What compiles must be
exactly the plan's compiled signatures: the training forward of the adapted policy (with gradient checkpointing
and `enable_input_require_grads` where the job turns it on) and KTO's KL forward; the reference, which TRL runs
as the policy with its adapter disabled, goes through the bare module and compiles nothing, as the plan labels
it. Every forward the run makes is a planned (batch, width): the PEFT reference is recorded on the policy
itself, so phases are compared only for the compiled passes.
"""

from __future__ import annotations

import pytest

from tests.support import online_runs, preference_runs
from tests.support.preference_runs import pair, unpaired
from tests.support.shape_recorder import compiled_shapes, planned_shapes

LORA = {"lora_r": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"]}
PREFERENCE = {
    "per_device_train_batch_size": 2,
    "max_length": 32,
    "pad_to_multiple_of": 16,
    "torch_compile": True,
}
ROWS = {"min_tokens": 20, "max_tokens": 32}


def shapes(found: set) -> set:
    return {(batch, width) for _, batch, width, _ in found}


@pytest.mark.parametrize(
    ("kind", "extra", "examples", "compiled"),
    [
        ("dpo", {}, [pair(6, 20, 25), pair(8, 30, 22)], {("train", 4, 32, None)}),
        (
            "kto",
            {},
            [unpaired(6, 20), unpaired(8, 30, label=False)],
            {("train", 2, 32, None), ("old_logps", 2, 32, None)},
        ),
    ],
)
def test_preference_lora_compiles_the_policy_only(tiny_model_dir, tmp_path, kind, extra, examples, compiled):
    args = {**PREFERENCE, **extra, "max_steps": 1}
    run = preference_runs.record(
        kind, tiny_model_dir, tmp_path, args, examples, torch_compile=True, peft=LORA
    )
    plan_with_lora = _with_peft(kind, tiny_model_dir, args)
    # KTO's plan also lists shorter KL rows these two examples cannot make: the run's are a subset
    assert run.compiled == compiled and compiled <= compiled_shapes(plan_with_lora)
    assert {phase for phase, *_ in compiled_shapes(plan_with_lora)} == {phase for phase, *_ in compiled}
    assert shapes(run.seen) <= shapes(planned_shapes(plan_with_lora))
    # one step: the policy's forwards (DPO: 1; KTO: main and KL) and as many reference forwards, adapter off
    assert run.calls == {"dpo": 2, "kto": 4}[kind]
    assert {s.phase for s in plan_with_lora.signatures if s.compile == "eager"} == {"ref"}


def test_reward_lora_on_a_sequence_classifier(tiny_reward_model_dir, tmp_path):
    args = {**PREFERENCE, "max_steps": 1}
    peft = {**LORA, "lora_task_type": "SEQ_CLS"}
    run = preference_runs.record(
        "reward",
        tiny_reward_model_dir,
        tmp_path,
        args,
        [pair(6, 20, 25), pair(8, 30, 22)],
        torch_compile=True,
        peft=peft,
    )
    plan = _with_peft("reward", tiny_reward_model_dir, args, peft=peft)
    assert run.compiled == compiled_shapes(plan) == {("train", 4, 32, None)}


def test_sft_lora_with_gradient_checkpointing(tiny_model_dir, tmp_path):
    from tests.support.shape_recorder import CPU_ARGS, DYNAMO_EAGER, ShapeRecorder, compiling

    args = {
        "per_device_train_batch_size": 2,
        "max_length": 32,
        "pad_to_multiple_of": 16,
        "gradient_checkpointing": True,
        "torch_compile": True,
        "max_steps": 2,
    }
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from tests.support.tiny_model import init_model
    from warmup.job.peft_args import lora_config

    recorder = ShapeRecorder()
    with compiling(recorder):
        trainer = SFTTrainer(
            model=init_model(tiny_model_dir),
            args=SFTConfig(output_dir=str(tmp_path / "out"), **{**CPU_ARGS, **args, **DYNAMO_EAGER}),
            train_dataset=Dataset.from_dict(
                {"input_ids": [[10 + i] * n for i, n in enumerate([20, 30, 17, 25])]}
            ),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
            peft_config=lora_config(LORA),
        )
        recorder.attach(trainer.model)
        trainer.train()
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(
        "lora_" in name for name in trainable
    )  # the adapter only: the job's trainable set
    plan = _with_peft("sft", tiny_model_dir, args, data={**ROWS, "min_tokens": 17, "num_train_examples": 4})
    assert recorder.compiled == compiled_shapes(plan) == {("train", 2, 32, None)}
    assert all(s.gradient_checkpointing and s.frozen for s in plan.signatures)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_online_lora_reference_is_the_bare_policy(tmp_path_factory, tmp_path, kind):
    model_dir = online_runs.write_tiny_model_with_weights(tmp_path_factory.mktemp(f"{kind}-lora"))
    args = {
        "per_device_train_batch_size": 2,
        "num_generations": 2,
        "max_completion_length": 8,
        "pad_to_multiple_of": 16,
        "beta": 0.1,
        "max_steps": 1,
        "torch_compile": True,
    }
    run = online_runs.record(
        kind, model_dir, tmp_path, args, [(5, 8), (12, 8)], torch_compile=True, peft=LORA
    )
    plan = _with_peft(kind, model_dir, args, data={"min_prompt_tokens": 5, "max_prompt_tokens": 16})
    assert run.compiled == compiled_shapes(plan) == {("train", 2, 32, None)}
    assert ("ref", 2, 32, None) in planned_shapes(plan)
    assert (2, 32) in shapes(run.seen - run.compiled)  # the reference (adapter off) and old log-probs, eager


def _with_peft(kind, model_dir, args, *, peft=LORA, data=None):
    """The planner's plan for the job with its peft block (the spec the user would write)."""
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec

    facts = data or {**ROWS, "num_train_examples": 2}
    return plan_spec(
        load_spec(
            {
                "trainer": kind,
                "model": str(model_dir),
                "args": {**args, "bf16": False},
                "peft": peft,
                "data": facts,
                "target": {"backend": "inductor", "device": "cpu"},
            }
        )
    )
