"""DPO (TRL's config and trainer of that name): chosen and rejected rows of one prompt, a reference pass."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="dpo",
    config_class="DPOConfig",
    trainer_class="DPOTrainer",
    planner="warmup.planner.preference:plan_dpo",
    dataset_rows="preference",
    step_phases=("train", "ref"),
    rehearsal_rows="warmup.rehearsal.drivers:dpo_step_rows",
    paired=True,
    completion_columns=("chosen", "rejected"),
    advised=True,
)
