"""Distillation (TRL's config and trainer of that name): one generation per prompt, a teacher."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="distillation",
    config_class="DistillationConfig",
    trainer_class="DistillationTrainer",
    planner="warmup.planner.distillation:plan_distillation",
    dataset_rows="prompts",
    step_phases=("train", "teacher", "generate_prefill", "generate_decode"),
    rehearsal_rows="warmup.rehearsal.drivers:prompt_step_rows",
    rehearsal_overrides={"shuffle_dataset": False},
    generates=True,
    needs_teacher=True,
)
