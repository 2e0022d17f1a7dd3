"""The record of one trainer family: TRL's names for it, where its planner and rehearsal live, and the facts of
its data and steps that the planner, the rehearsal, the dataset facts and the advisor would otherwise branch on."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from warmup.signature import Phase

# How the dataset facts read a row and a prompt, after one of TRL's `_prepare_dataset` (warmup/facts/rows.py `Rows`):
# SFT's text or prompt-completion rows, DPO / KTO's prompt and completions, Reward's chosen and rejected rows, or
# the prompts an online trainer generates from.
DatasetRows = Literal["sft", "preference", "reward", "prompts"]


@dataclass(frozen=True)
class TrainerFamily:
    """What trl-warmup knows of one trainer kind (`spec.trainer`)."""

    kind: str
    # TRL's config class, built by TRL itself (warmup/job/trl_args.py), and the trainer class the rehearsal runs.
    config_class: str
    trainer_class: str
    # `module:function` taking a PlanBuilder (warmup/planner/<family>.py).
    planner: str
    dataset_rows: DatasetRows
    # The phases one training step runs; forward-only passes of the same shape ride along with the step.
    step_phases: tuple[Phase, ...]
    # `module:function` building a unit's rows (warmup/rehearsal/drivers.py).
    rehearsal_rows: str
    # Graph-neutral config overrides that make the rehearsal's steps take their data in order (step k: unit k).
    rehearsal_overrides: Mapping[str, Any] = field(
        default_factory=lambda: {"train_sampling_strategy": "sequential"}
    )
    # A batch stacks chosen over rejected: two rows per example (DPO, Reward).
    paired: bool = False
    # The completions a prompt is the common prefix of.
    completion_columns: tuple[str, ...] = ("completion",)
    # Chosen / rejected examples become one unpaired row each (KTO's unpair_preference_dataset).
    unpairs_preferences: bool = False
    # A prompt of max_length or more drops its example, whatever the truncation mode (KTO).
    drops_long_prompts: bool = False
    # A pair with a row over max_length is dropped, not truncated (Reward).
    drops_long_pairs: bool = False
    # The config's packing / padding_free concatenate rows (SFT).
    packs: bool = False
    # TRL slices rows with a negative max_length, and the planner follows it (SFT).
    plans_negative_max_length: bool = False
    # The loss fuses the LM head, whose gathered weight ZeRO-3 on CPU breaks in backward (SFT; planner/sharding.py).
    fused_lm_head_loss: bool = False
    # A step also runs a batch of mismatched (KL) rows of its own width (KTO).
    kl_rows: bool = False
    # Each step generates: a prompt and a completion width, generation pinned per unit.
    generates: bool = False
    # Several completions per prompt, a round spread over every process and scored by reward functions (GRPO, RLOO).
    generation_groups: bool = False
    # Old log-probs are computed every generation round, whatever the accumulation (RLOO).
    old_logps_every_round: bool = False
    # The spec names a teacher model (distillation).
    needs_teacher: bool = False
    # `warmup advise` replays its batching (warmup/advise/).
    advised: bool = False
    # A spec's data.length_histogram holds each example's whole row length (one sequence per row), enough for
    # `warmup advise` and the status page's advice without the dataset (SFT).
    advised_from_histogram: bool = False

    def plan(self, builder: Any) -> None:
        """Add the family's signatures to a `warmup.planner.common.PlanBuilder`."""
        _resolve(self.planner)(builder)

    def build_rehearsal_rows(
        self, unit: Any, config: Any, tokenizer: Any, world: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """(train rows, eval rows) whose batches TRL's own collator turns into exactly the unit's shape."""
        rows: tuple[list[dict[str, Any]], list[dict[str, Any]] | None] = _resolve(self.rehearsal_rows)(
            self, unit, config, tokenizer, world
        )
        return rows

    @property
    def rows_per_example(self) -> int:
        return 2 if self.paired else 1


def _resolve(reference: str) -> Callable[..., Any]:
    # By name, not by import: the planner and the rehearsal import TRL's machinery, and a pod imports the records.
    module, _, name = reference.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found
