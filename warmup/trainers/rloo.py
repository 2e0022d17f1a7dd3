"""RLOO (TRL's config and trainer of that name): GRPO's generation groups, old log-probs every round."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="rloo",
    config_class="RLOOConfig",
    trainer_class="RLOOTrainer",
    planner="warmup.planner.online:plan_rloo",
    dataset_rows="prompts",
    step_phases=("train", "ref", "old_logps", "generate_prefill", "generate_decode"),
    rehearsal_rows="warmup.rehearsal.drivers:prompt_step_rows",
    rehearsal_overrides={"shuffle_dataset": False},
    generates=True,
    generation_groups=True,
    old_logps_every_round=True,
    advised=True,
)
