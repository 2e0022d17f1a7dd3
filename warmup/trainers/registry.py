"""The trainer families by kind: the one table of what each `spec.trainer` is."""

from __future__ import annotations

from warmup.errors import UnknownTrainerError
from warmup.trainers import distillation, dpo, grpo, kto, reward, rloo, sft
from warmup.trainers.record import TrainerFamily

FAMILIES: dict[str, TrainerFamily] = {
    record.kind: record
    for record in (
        sft.FAMILY,
        dpo.FAMILY,
        kto.FAMILY,
        reward.FAMILY,
        grpo.FAMILY,
        rloo.FAMILY,
        distillation.FAMILY,
    )
}


def family(kind: str) -> TrainerFamily:
    """The record of a trainer kind; UnknownTrainerError for a kind that has none."""
    found = FAMILIES.get(kind)
    if found is None:
        raise UnknownTrainerError(
            f"unknown trainer {kind!r}: expected one of {', '.join(FAMILIES)}", loc="trainer"
        )
    return found
