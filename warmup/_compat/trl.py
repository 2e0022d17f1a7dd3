"""TRL's private names, in one place: the model loader the rehearsal swaps, the trainer methods it records
shapes through, and the packing functions the data facts replay.

Written against TRL 1.16.0; checked on TRL 1.16.0 (`CHECKED_ON`). `check()` resolves every target
(tests/unit/test_compat.py). Importing this module imports no TRL.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from warmup._compat import targets
from warmup._compat.targets import Target
from warmup.errors import IncompatibleLibraryError

LIBRARY = "trl"
CHECKED_ON = ("1.16.0",)

_ORIGINAL_LOADER = "_warmup_original_create_model_from_path"
# The trainer methods whose calls the rehearsal records (each replaced on the trainer instance, not its class).
GENERATE = "_generate_single_turn"
LOG_PROBS = "_get_per_token_logps_and_entropies"
HIDDEN_STATE = "_get_last_hidden_state"
TARGETS = (
    Target("trl.trainer.utils", "create_model_from_path", "build_models_with", ("model_id", "architecture")),
    Target("trl", f"GRPOTrainer.{GENERATE}", "trainer_method", ("self", "prompt_ids")),
    Target("trl", f"RLOOTrainer.{GENERATE}", "trainer_method", ("self", "prompt_ids")),
    Target(
        "trl",
        f"GRPOTrainer.{LOG_PROBS}",
        "trainer_method",
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"),
    ),
    Target(
        "trl",
        f"RLOOTrainer.{LOG_PROBS}",
        "trainer_method",
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"),
    ),
    Target(
        "trl.trainer.distillation_trainer",
        f"DistillationTrainer.{HIDDEN_STATE}",
        "trainer_method",
        ("self", "unwrapped_model", "input_ids"),
    ),
    Target("trl.data_utils", "_pack_bfd", "pack", ("examples", "seq_length", "on_seq_length_overflow")),
    Target("trl.data_utils", "_pack_wrapped", "pack", ("examples", "seq_length")),
)


def check() -> list[str]:
    """Every target of this seam that does not hold at the installed TRL, one line each."""
    return targets.check(LIBRARY, CHECKED_ON, TARGETS)


def _get(attribute: str) -> Any:
    return targets.resolve(LIBRARY, CHECKED_ON, next(t for t in TARGETS if t.attribute == attribute))


def build_models_with(loader: Callable[..., Any]) -> None:
    """Make every TRL module that imported `create_model_from_path` (the trainers load their models, reference
    and teacher models with it) call `loader` instead, with the same arguments. Repeatable: TRL's own loader
    is kept aside the first time and found again."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, _ORIGINAL_LOADER, None) or _get("create_model_from_path")
    setattr(trl_utils, _ORIGINAL_LOADER, original)
    for name, module in list(sys.modules.items()):
        if name.startswith("trl.") and getattr(module, "create_model_from_path", None) is original:
            setattr(module, "create_model_from_path", loader)  # noqa: B010 (a module attribute)


def trainer_method(trainer: Any, name: str) -> Callable[..., Any] | None:
    """The trainer's bound method `name` (one of GENERATE, LOG_PROBS, HIDDEN_STATE), or None where its class
    has none (a trainer that does not generate, or not distil)."""
    if name not in (GENERATE, LOG_PROBS, HIDDEN_STATE):
        raise ValueError(f"{name} is not a trainer method this seam knows")
    method: Callable[..., Any] | None = getattr(trainer, name, None)
    return method


def replace_trainer_method(trainer: Any, name: str, replacement: Callable[..., Any]) -> None:
    """Replace the trainer's method `name` on this trainer only (see `trainer_method`)."""
    if trainer_method(trainer, name) is None:
        raise IncompatibleLibraryError(
            f"trl: {type(trainer).__name__} has no {name}; the rehearsal records its calls (checked on trl "
            f"{', '.join(CHECKED_ON)})"
        )
    setattr(trainer, name, replacement)


def pack(table: Any, seq_length: int, strategy: str) -> Any:
    """TRL's packing of a pyarrow table of `input_ids` into rows of `seq_length`, by `strategy`: `wrapped`,
    `bfd` (an overlong example truncated) or `bfd_split` (split)."""
    if strategy == "wrapped":
        return _get("_pack_wrapped")(table, seq_length)
    overflow = "split" if strategy == "bfd_split" else "truncate"
    return _get("_pack_bfd")(table, seq_length, overflow)
