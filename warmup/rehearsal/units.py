"""Signatures -> rehearsal units: the training steps (or evaluations) that produce them.

A unit is one step of the user's trainer that produces a set of signatures at once. TRL's own
steps decide the grouping: a DPO training step runs the policy forward and backward and the
reference forward on the same batch, a GRPO step generates, scores (reference / old log-probs) and
trains, so the signatures of one step share one unit and one entry. (The supervisor may in turn run
several training units as consecutive steps of one process, see `zygote`.)

Signatures that compile nothing on the target get no unit: their entry is empty and says why
(`eager_reason`: the planner labels them `compile == "eager"`; under Inductor generation, Trainer
evaluation and GRPO/RLOO old log-probs run on the bare, uncompiled model).

Pure Python: the planner's signatures in, units out; nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from warmup.errors import RehearsalError
from warmup.signature import Signature
from warmup.trainers.registry import FAMILIES, family

UnitKind = Literal["train", "eval"]

GENERATION_PHASES = ("generate_prefill", "generate_decode")


class RehearsalUnit(BaseModel):
    """One rehearsal run: which trainer path to drive, the batch it must produce, what it covers."""

    model_config = ConfigDict(frozen=True)

    index: int
    kind: UnitKind = Field(description="train: one optimizer step through trainer.train(); eval: evaluate().")
    batch: int = Field(description="Rows the collator produces (DPO/Reward: 2 x pairs).")
    seq_len: int = Field(description="Padded width of the batch (GRPO/RLOO: prompt + completion).")
    prompt_len: int | None = Field(
        None, description="GRPO/RLOO: padded prompt width the generation round uses."
    )
    completion_len: int | None = Field(None, description="GRPO/RLOO: completion tokens every row generates.")
    cache_len: int | None = Field(None, description="GRPO/RLOO: static KV-cache length to pin, if planned.")
    kl_len: int | None = Field(
        None, description="KTO: padded width of the step's KL rows (None: no KL term)."
    )
    signatures: list[Signature]

    @property
    def keys(self) -> list[str]:
        return [signature.key() for signature in self.signatures]

    @property
    def label(self) -> str:
        first = self.signatures[0].shape_label
        more = f" (+{len(self.signatures) - 1})" if len(self.signatures) > 1 else ""
        return first + more


class UnitPlan(BaseModel):
    """Units to run, and the signatures that need no run (with the reason)."""

    units: list[RehearsalUnit]
    nothing_to_compile: dict[str, str] = Field(default_factory=dict, description="signature key -> why")


def plan_units(
    trainer: str,
    signatures: list[Signature],
    *,
    backend: str = "inductor",
    pad_to_multiple_of: int | None,
    max_completion_length: int | None = None,
    generation_rows: dict[str, int] | None = None,
    max_length: int | None = None,
) -> UnitPlan:
    """Group `signatures` of a `trainer` job into rehearsal units.

    `pad_to_multiple_of` is the value the job's TRL config resolves to on the target device, and
    `max_completion_length` the GRPO/RLOO config value: they decide how a GRPO width splits into a
    prompt and a completion. A forward-only pass (ref, old_logps) rides with the training step of
    the same shape, or else with an evaluation (TRL runs the reference over eval batches too).
    `generation_rows` ({"train": rows, "eval": rows} of a generation round) sends a compiled
    generation signature to a training step or to an evaluation.
    """
    nothing: dict[str, str] = {}
    compiled: list[Signature] = []
    for signature in signatures:
        if signature.trainer != trainer:
            raise RehearsalError(
                f"signature {signature.shape_label} belongs to trainer {signature.trainer!r}, not {trainer!r}"
            )
        reason = eager_reason(trainer, backend, signature)
        if reason:
            nothing[signature.key()] = reason
        else:
            compiled.append(signature)
    if not compiled:  # a plan whose every pass runs eager needs no rehearsal, whatever the trainer
        return UnitPlan(units=[], nothing_to_compile=nothing)
    require_rehearsable(trainer)

    units: list[RehearsalUnit] = []
    record = family(trainer)
    if record.kl_rows:
        units, compiled = kto_steps(compiled, pad_to_multiple_of, max_length)
    train_shapes = {(s.batch, s.seq_len) for s in compiled if s.phase == "train"}
    groups: dict[tuple[Any, ...], list[Signature]] = {}
    generation: list[Signature] = []
    for signature in compiled:
        if signature.phase in GENERATION_PHASES:
            generation.append(signature)
            continue
        if signature.phase not in (*record.step_phases, "eval"):
            raise RehearsalError(f"the {trainer} rehearsal has no step that runs phase {signature.phase!r}")
        in_step = signature.phase == "train" or (
            signature.phase != "eval" and (signature.batch, signature.seq_len) in train_shapes
        )
        prompt_len = signature.settings.get("prompt_len")
        key = ("train" if in_step else "eval", signature.batch, signature.seq_len)
        groups.setdefault((*key, prompt_len if isinstance(prompt_len, int) else None), []).append(signature)

    for (kind, batch, seq_len, prompt_len), members in groups.items():
        fields = {}
        if record.generates:
            fields = _split_width(seq_len, prompt_len, pad_to_multiple_of, max_completion_length)
        units.append(
            RehearsalUnit(index=0, kind=kind, batch=batch, seq_len=seq_len, signatures=members, **fields)
        )
    for signature in generation:
        _attach_generation(units, signature, generation_rows or {})
    ordered = sorted(units, key=lambda u: (u.kind != "train", u.seq_len, u.batch))
    return UnitPlan(
        units=[unit.model_copy(update={"index": index}) for index, unit in enumerate(ordered)],
        nothing_to_compile=nothing,
    )


# KTO: the shortest row the synthetic data has (a one-token prompt, a one-token completion and its EOS, one
# special token): a step's KL rows join one example's prompt to its neighbour's completion, so the main and
# KL widths a step can have together are bounded by each other (see data.kto_rows).
KTO_TINY_ROW = 4


def kto_steps(
    signatures: list[Signature], multiple: int | None, max_length: int | None
) -> tuple[list[RehearsalUnit], list[Signature]]:
    """KTO training steps: each runs the policy's KL forward (no grad, phase old_logps) on KL rows of one
    width, the main forward and backward on rows of another, and the reference model on both.

    Every train signature gets a step; each KL width is paired with a main width of the same batch that one
    batch of examples can produce together (KL rows rotate completions within the batch, so neither width can
    be much more than twice the other); reference signatures ride with a step that has their width. Returns the
    steps and the signatures left for the generic grouping (evaluation, and references no step covers).
    """
    train = [s for s in signatures if s.phase == "train"]
    kl = [s for s in signatures if s.phase == "old_logps"]
    refs = [s for s in signatures if s.phase == "ref"]
    rest = [s for s in signatures if s.phase not in ("train", "old_logps", "ref")]
    pairs: list[tuple[int, int, int | None]] = []  # (batch, main width, KL width)
    kl_left = {(s.batch, s.seq_len) for s in kl}
    for signature in sorted(train, key=lambda s: (s.batch, s.seq_len)):
        batch, width = signature.batch, signature.seq_len
        widths = sorted(
            {w for b, w in kl_left if b == batch and _kto_pair_fits(width, w, multiple, max_length)}
        )
        if widths:
            choice: int | None = min(widths, key=lambda w: abs(w - width))
        elif any(s.batch == batch for s in kl):
            choice = width  # every KL width of this batch is covered: KL rows as wide as the main rows
        else:
            choice = None  # no KL term (apo_zero_unpaired)
        pairs.append((batch, width, choice))
        kl_left.discard((batch, choice or 0))
    for batch, width in sorted(kl_left):
        mains = {
            s.seq_len
            for s in train
            if s.batch == batch and _kto_pair_fits(s.seq_len, width, multiple, max_length)
        }
        if not mains:
            raise RehearsalError(
                f"no KTO training step of {batch} rows can produce KL rows {width} wide together with a main width "
                "of the plan; the plan and the spec disagree"
            )
        pairs.append((batch, min(mains, key=lambda w: abs(w - width)), width))
    units: list[RehearsalUnit] = []
    taken: set[str] = set()
    pool = train + kl + refs
    for batch, width, kl_width in pairs:
        shapes = {("train", width), ("ref", width)}
        if kl_width is not None:
            shapes |= {("old_logps", kl_width), ("ref", kl_width)}
        members = [
            s for s in pool if s.batch == batch and (s.phase, s.seq_len) in shapes and s.key() not in taken
        ]
        taken.update(s.key() for s in members)
        if members:
            units.append(
                RehearsalUnit(
                    index=0, kind="train", batch=batch, seq_len=width, kl_len=kl_width, signatures=members
                )
            )
    return units, rest + [s for s in refs if s.key() not in taken]


def _kto_pair_fits(main: int, kl: int, multiple: int | None, max_length: int | None) -> bool:
    """Whether one batch can have main rows `main` wide and KL rows `kl` wide (see data.kto_rows)."""
    longest_main, longest_kl = (min(w, max_length) if max_length else w for w in (main, kl))
    if ceil_to(longest_main, multiple) != main or ceil_to(longest_kl, multiple) != kl:
        return False
    if main == kl:
        return True
    return max(longest_main, longest_kl) <= 2 * min(longest_main, longest_kl) - KTO_TINY_ROW


def require_rehearsable(trainer: str) -> None:
    """Raise RehearsalError, before any work, for a trainer whose rehearsal is not written."""
    if trainer not in FAMILIES:
        raise RehearsalError(
            f"rehearsal of the {trainer!r} trainer is not written yet "
            f"(supported: {', '.join(FAMILIES)}); `warmup plan` lists its signatures"
        )


def eager_reason(trainer: str, backend: str, signature: Signature) -> str | None:
    """Why a signature compiles nothing, or None when it compiles.

    The planner decides (warmup/planner/common.py, `runs_on`): under Inductor only what goes
    through the compiled wrapper compiles; generation, Trainer evaluation and GRPO/RLOO old
    log-probs run the bare module and are labelled "eager". Under TorchNeuron eager ops compile too.
    """
    if signature.compile == "eager":
        return f"runs eager on {backend}: TRL calls the uncompiled module for this pass (nothing to warm)"
    return None


def ceil_to(value: int, multiple: int | None) -> int:
    return math.ceil(value / multiple) * multiple if multiple else value


def _split_width(
    width: int, prompt_len: int | None, multiple: int | None, max_completion: int | None
) -> dict[str, int]:
    """Split a GRPO/RLOO training width into the padded prompt and the completion tokens to generate.

    The training graph sees only the total width (TRL slices the completion outside the model), so any
    split the generation round can produce works; the largest completion bucket is preferred, which
    keeps the prompt short.
    """
    if max_completion is None:
        raise RehearsalError("a GRPO/RLOO rehearsal needs max_completion_length")
    step = multiple or 1
    top_completion = ceil_to(max_completion, multiple)
    if prompt_len is not None:
        completion_pad = width - prompt_len
    else:
        completion_pad = min(top_completion, width - step)
        completion_pad -= completion_pad % step
    prompt_pad = width - completion_pad
    # the generated length must pad to completion_pad and fit in max_completion_length
    completion = min(completion_pad, max_completion)
    if (
        completion_pad < step
        or prompt_pad < step
        or completion < 1
        or ceil_to(completion, multiple) != completion_pad
        or (multiple and prompt_pad % multiple)
    ):
        raise RehearsalError(
            f"a GRPO/RLOO training width of {width} cannot be split into a prompt and a completion of "
            f"at most "
            f"{max_completion} tokens padded to multiples of {multiple}; the plan and the spec disagree"
        )
    return {"prompt_len": prompt_pad, "completion_len": completion}


def _attach_generation(units: list[RehearsalUnit], signature: Signature, rows: dict[str, int]) -> None:
    """A compiled generation signature rides with a run whose round uses its rows and prompt width."""
    prompt_len = signature.seq_len if signature.phase == "generate_prefill" else None
    kinds = [kind for kind, count in rows.items() if count == signature.batch] or ["train", "eval"]
    for index, unit in sorted(enumerate(units), key=lambda item: item[1].kind != "train"):
        if unit.kind not in kinds or unit.prompt_len is None:
            continue
        if prompt_len is not None and unit.prompt_len != prompt_len:
            continue
        if (
            unit.cache_len is not None
            and signature.cache_len is not None
            and unit.cache_len != signature.cache_len
        ):
            continue
        update: dict[str, Any] = {"signatures": [*unit.signatures, signature]}
        if signature.cache_len is not None:
            update["cache_len"] = signature.cache_len
        units[index] = unit.model_copy(update=update)
        return
    raise RehearsalError(
        f"no run of the plan generates {signature.batch} rows from a prompt width of {prompt_len} "
        f"for {signature.shape_label}; a generation signature is rehearsed inside a training step or "
        "an evaluation, so the plan must list one"
    )
