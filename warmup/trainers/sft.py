"""SFT (TRL's config and trainer of that name): text or prompt-completion rows, packing and padding-free."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="sft",
    config_class="SFTConfig",
    trainer_class="SFTTrainer",
    planner="warmup.planner.sft:plan_sft",
    dataset_rows="sft",
    step_phases=("train",),
    rehearsal_rows="warmup.rehearsal.drivers:sft_step_rows",
    packs=True,
    plans_negative_max_length=True,
    fused_lm_head_loss=True,
    advised=True,
    advised_from_histogram=True,
)
