"""DPO, KTO and Reward. trl-shapes.md sections 4.1-4.3 and 10.3."""

from __future__ import annotations

from warmup.errors import SpecError
from warmup.planner.common import PlanBuilder


def plan_dpo(plan: PlanBuilder) -> None:
    raise SpecError("the DPO planner is not written yet", loc="trainer")


def plan_kto(plan: PlanBuilder) -> None:
    raise SpecError("the KTO planner is not written yet", loc="trainer")


def plan_reward(plan: PlanBuilder) -> None:
    raise SpecError("the Reward planner is not written yet", loc="trainer")
