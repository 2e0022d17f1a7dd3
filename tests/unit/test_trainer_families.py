"""The trainer families' records (warmup/trainers/): one per kind the spec accepts, each naming what exists."""

from __future__ import annotations

import importlib
import pkgutil
from typing import get_args

import pytest
import transformers
import trl

import warmup.trainers
from warmup.errors import UnknownTrainerError
from warmup.job.spec import TrainerKind
from warmup.signature import Phase
from warmup.trainers.record import TrainerFamily
from warmup.trainers.registry import FAMILIES, family


def _records_in_modules() -> list[TrainerFamily]:
    records = []
    for module in pkgutil.iter_modules(warmup.trainers.__path__):
        found = getattr(importlib.import_module(f"warmup.trainers.{module.name}"), "FAMILY", None)
        if isinstance(found, TrainerFamily):
            records.append(found)
    return records


def test_every_trainer_kind_has_exactly_one_record():
    kinds = [record.kind for record in _records_in_modules()]
    assert sorted(kinds) == sorted(get_args(TrainerKind))
    assert list(FAMILIES) == list(
        get_args(TrainerKind)
    )  # the registry holds each module's record, in spec order
    assert all(family(kind) is FAMILIES[kind] for kind in kinds)


@pytest.mark.parametrize("kind", get_args(TrainerKind))
def test_a_record_names_trls_own_classes(kind):
    record = family(kind)
    assert issubclass(getattr(trl, record.config_class), transformers.TrainingArguments)
    assert issubclass(getattr(trl, record.trainer_class), transformers.Trainer)


@pytest.mark.parametrize("kind", get_args(TrainerKind))
def test_a_record_names_its_planner_and_rows_and_real_phases(kind):
    record = family(kind)
    for reference in (record.planner, record.rehearsal_rows):
        module, _, name = reference.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), reference
    assert record.step_phases[0] == "train"
    assert set(record.step_phases) <= set(get_args(Phase))


def test_an_unknown_kind_is_the_unknown_trainer_error():
    with pytest.raises(UnknownTrainerError, match="unknown trainer 'orpo'"):
        family("orpo")
