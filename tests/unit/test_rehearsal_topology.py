"""How many processes rehearse a job of N, the config its ranks get, and what the plan says about it."""

from __future__ import annotations

import pytest

from warmup.job.spec import load_spec
from warmup.job.trl_args import resolve_trainer_args
from warmup.planner.planning import plan_spec
from warmup.planner.topology import rank_args, rehearsal_processes

CPU = {"backend": "inductor", "device": "cpu"}
GRPO = {"per_device_train_batch_size": 2, "max_completion_length": 8, "pad_to_multiple_of": 16}


def spec(model, trainer="sft", args=None, world_size=1, target=CPU, data=None):
    base = {"max_length": 32, "pad_to_multiple_of": 32} if trainer != "grpo" else GRPO
    return load_spec(
        {
            "trainer": trainer,
            "model": str(model),
            "args": {"torch_compile": True, "use_cpu": True, **base, **(args or {})},
            "data": data or ({"max_prompt_tokens": 16} if trainer == "grpo" else {"max_tokens": 32}),
            "target": {**target, "world_size": world_size},
        }
    )


def processes(job):
    args = resolve_trainer_args(job)
    return rehearsal_processes(job, args.config, args.launch)


@pytest.mark.parametrize(("trainer", "world", "expected"), [("sft", 1, 1), ("sft", 3, 2), ("dpo", 64, 2)])
def test_a_job_of_several_processes_is_rehearsed_with_two(tiny_model_dir, trainer, world, expected):
    assert processes(spec(tiny_model_dir, trainer, world_size=world)) == expected


@pytest.mark.parametrize(
    ("num_generations", "world", "expected"),
    [
        (2, 64, 2),  # 2 rows x 2 processes hold whole groups of 2
        (6, 3, 3),  # 2 x 2 = 4 rows do not hold groups of 6; 2 x 3 = 6 do
        (8, 64, 4),  # 2 x 4 = 8
    ],
)
def test_grpo_needs_whole_generation_groups_across_the_rehearsal_processes(
    tiny_model_dir, num_generations, world, expected
):
    job = spec(tiny_model_dir, "grpo", {"num_generations": num_generations}, world_size=world)
    assert processes(job) == expected


def test_grpo_eval_batches_must_hold_whole_groups_too(tiny_model_dir):
    args = {"num_generations": 2, "eval_strategy": "steps", "per_device_eval_batch_size": 1}
    job = spec(
        tiny_model_dir, "grpo", args, world_size=8, data={"max_prompt_tokens": 16, "num_eval_examples": 8}
    )
    # train: 2 x 2 rows hold groups of 2; eval: 1 x 2 processes = 2 rows hold them too
    assert processes(job) == 2
    job = spec(tiny_model_dir, "grpo", {**args, "num_generations_eval": 4}, world_size=8)
    assert processes(job) == 4  # the eval batch, 1 x W, must hold groups of 4


def test_the_ranks_get_the_jobs_per_rank_generation_rows_not_its_global_batch(tiny_model_dir):
    # 4 processes x 2 rows x 2 steps: a global generation batch of 16
    job = spec(tiny_model_dir, "grpo", {"num_generations": 2, "generation_batch_size": 16}, world_size=4)
    config = resolve_trainer_args(job).config
    assert config.steps_per_generation == 2
    args = rank_args(job, config, 2)
    assert "generation_batch_size" not in args and args["steps_per_generation"] == 2
    assert rank_args(job, config, 4) == job.args  # the job's own number of processes: as given


def test_the_plan_says_how_a_multi_process_job_is_warmed(tiny_model_dir):
    assert plan_spec(spec(tiny_model_dir, world_size=1)).notes == []
    plan = plan_spec(spec(tiny_model_dir, world_size=3))
    assert {s.world_size for s in plan.signatures} == {3}
    assert any("warm-up runs 2 processes" in note for note in plan.notes)
    assert any("OMP_NUM_THREADS" in note for note in plan.notes)
    assert any("autograd_cache_bypass" in warning for warning in plan.warnings)  # DDP's split graphs


def test_a_multi_gpu_job_is_told_to_use_virtual_local_ranks(tiny_model_dir):
    gpu = {"backend": "inductor", "device": "cuda"}
    plan = plan_spec(spec(tiny_model_dir, world_size=8, target=gpu))
    assert any("--virtual-local-rank" in warning for warning in plan.warnings)
