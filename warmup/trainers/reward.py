"""Reward modelling (TRL's config and trainer of that name): chosen over rejected, over-long pairs dropped."""

from warmup.trainers.record import TrainerFamily

FAMILY = TrainerFamily(
    kind="reward",
    config_class="RewardConfig",
    trainer_class="RewardTrainer",
    planner="warmup.planner.preference:plan_reward",
    dataset_rows="reward",
    step_phases=("train",),
    rehearsal_rows="warmup.rehearsal.drivers:reward_step_rows",
    paired=True,
    drops_long_pairs=True,
    advised=True,
)
