"""DistillationTrainer: student generation, student train, teacher forward. trl-shapes.md section 4.4."""

from __future__ import annotations

from warmup.errors import SpecError
from warmup.planner.common import PlanBuilder


def plan_distillation(plan: PlanBuilder) -> None:
    raise SpecError("the distillation planner is not written yet", loc="trainer")
