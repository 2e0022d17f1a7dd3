"""GRPO and RLOO: generation, then training over the prompt x completion grid. trl-shapes.md section 5."""

from __future__ import annotations

from warmup.errors import SpecError
from warmup.planner.common import PlanBuilder


def plan_grpo(plan: PlanBuilder) -> None:
    raise SpecError("the GRPO planner is not written yet", loc="trainer")


def plan_rloo(plan: PlanBuilder) -> None:
    raise SpecError("the RLOO planner is not written yet", loc="trainer")
