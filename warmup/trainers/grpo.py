"""GRPO (TRL's config and trainer of that name): groups of generations per prompt, scored and trained on."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="grpo",
    config_class="GRPOConfig",
    trainer_class="GRPOTrainer",
    planner="warmup.planner.online:plan_grpo",
    dataset_rows="prompts",
    step_phases=("train", "ref", "old_logps", "generate_prefill", "generate_decode"),
    rehearsal_rows="warmup.rehearsal.drivers:prompt_step_rows",
    rehearsal_overrides={"shuffle_dataset": False},
    generates=True,
    generation_groups=True,
    advised=True,
)
