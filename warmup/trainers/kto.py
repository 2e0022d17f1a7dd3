"""KTO (TRL's config and trainer of that name): unpaired completions, a reference pass and the KL rows."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="kto",
    config_class="KTOConfig",
    trainer_class="KTOTrainer",
    planner="warmup.planner.preference:plan_kto",
    dataset_rows="preference",
    step_phases=("train", "ref"),  # the KL forward (old_logps) is placed by warmup.rehearsal.units.kto_steps
    rehearsal_rows="warmup.rehearsal.drivers:kto_step_rows",
    unpairs_preferences=True,
    drops_long_prompts=True,
    kl_rows=True,
)
