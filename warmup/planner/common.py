"""What every trainer family's planner shares: padding buckets, batch sizes, the plan under construction.

The rules are TRL 1.16's (docs/trl-shapes.md, sections 1-3): TRL pads each batch to
`ceil_m(longest row in the batch)` with no cap at max_length, so the reachable lengths are the
multiples of m from the smallest possible batch maximum to `ceil_m(longest possible row)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any, Literal

from warmup.errors import FieldProblem, PlanTooLargeError
from warmup.job.model_facts import ModelFacts
from warmup.job.spec import DataFacts, Spec
from warmup.job.trl_args import TrainerArgs
from warmup.planner.sharding import sharding_label
from warmup.signature import Phase, Plan, SettingValue, Signature

# Which module TRL calls for a pass, which decides whether torch.compile (Inductor) compiles it:
# - "wrapped": a module accelerate prepared, so wrapped in torch.compile when torch_compile is on: the policy as
#   the Trainer passes it to compute_loss while training, and separate reference / teacher copies prepared at init;
# - "bare": the policy module itself, outside that wrapper: the evaluation loop (transformers 5.24 evaluates
#   `self.model`), reference precompute (in __init__), the PEFT reference and GRPO / RLOO old log-probs (TRL calls
#   `self.model`), and DistillationTrainer's forwards (its `_forward_redirection` patches the wrapper's forward);
# - "generate": the forwards inside `generate`, which TRL calls with `disable_compile=True` on the unwrapped module.
# Under Inductor only "wrapped" passes compile; on Neuron every pass compiles (TorchNeuron compiles eager ops too).
RunsOn = Literal["wrapped", "bare", "generate"]

# A spec that plans more than this many signatures is refused: no warm-up budget covers it, and it
# almost always means padding is off.
MAX_SIGNATURES = 2048


def ceil_to(value: int, multiple: int | None) -> int:
    """TRL's padding: round up to a multiple of `multiple` (no rounding when None)."""
    if not multiple:
        return value
    return math.ceil(value / multiple) * multiple


def padded_lengths(low: int, high: int, multiple: int | None) -> list[int]:
    """Every padded length a batch whose longest row is in [low, high] can have.

    Refuses, before listing them, more lengths than a plan may have signatures: every caller lists at
    least one signature per length, and a spec with a huge max_length and no padding would otherwise
    build millions of them (gigabytes) only to be refused at the end.
    """
    if low > high:
        return []
    lengths = (
        range(low, high + 1)
        if not multiple
        else range(ceil_to(low, multiple), ceil_to(high, multiple) + 1, multiple)
    )
    if len(lengths) > MAX_SIGNATURES:
        raise PlanTooLargeError(
            f"the spec plans more than {MAX_SIGNATURES} signatures: {len(lengths)} padded sequence lengths "
            f"from {lengths[0]} to {lengths[-1]} (pad_to_multiple_of {multiple}); set pad_to_multiple_of "
            "(128 on Neuron) and bound the lengths (max_length, data.max_tokens) so that the shapes are few",
            loc="args.pad_to_multiple_of",
        )
    return list(lengths)


def kth_smallest_length(histogram: dict[int, int], k: int) -> int:
    """The k-th smallest example length (1-based) in a length histogram."""
    seen = 0
    for length in sorted(histogram):
        seen += histogram[length]
        if seen >= k:
            return length
    return max(histogram)


def smallest_batch_max(data: DataFacts, rows: int, default: int = 1) -> int:
    """The smallest possible longest-row of a batch of `rows` examples, from the data facts."""
    if data.length_histogram:
        return kth_smallest_length(data.length_histogram, rows)
    return data.shortest or default


def partial_batch(num_examples: int | None, batch: int, *, drop_last: bool, world_size: int) -> int | None:
    """Rows in the short last batch of an epoch, if there is one.

    Only a single process sees it: with several processes accelerate's even_batches fills the last
    batch by cycling samples from the start of the epoch (docs/trl-shapes.md, section 3).
    """
    if num_examples is None or drop_last or world_size > 1:
        return None
    remainder = num_examples % batch
    return remainder or None


def full_batch_reachable(num_examples: int | None, batch: int, world_size: int) -> bool:
    """Whether a full batch of `batch` rows per process ever occurs."""
    if num_examples is None or world_size > 1:
        return True
    return num_examples >= batch


def evaluates(plan: PlanBuilder) -> bool:
    """Whether the job runs evaluation at all (eval_strategy or eval_on_start), with eval data to run on."""
    strategy = str(getattr(plan.args.eval_strategy, "value", plan.args.eval_strategy))
    if strategy == "no" and not plan.args.eval_on_start:
        return False
    if plan.data.num_eval_examples == 0:
        plan.warn("evaluation is configured but data.num_eval_examples is 0: no eval shapes are listed")
        return False
    return True


def graph_hash(settings: Any) -> str:
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclasses.dataclass
class PlanBuilder:
    """A plan under construction: the spec's resolved facts, the signatures so far, the warnings."""

    spec: Spec
    args: TrainerArgs
    model: ModelFacts
    teacher: ModelFacts | None = None
    signatures: dict[str, Signature] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    # Keys of the signatures Dynamo traces, on either backend: what its recompile limit counts.
    dynamo_keys: set[str] = dataclasses.field(default_factory=set)
    # Facts the plan needed and did not have (see need()).
    missing: list[FieldProblem] = dataclasses.field(default_factory=list)

    @property
    def multiple(self) -> int | None:
        """The resolved pad_to_multiple_of (None: no padding)."""
        multiple: int | None = self.args.pad_to_multiple_of
        return multiple

    @property
    def world_size(self) -> int:
        return self.spec.target.world_size

    @property
    def data(self) -> DataFacts:
        return self.spec.data

    @property
    def weight_dtype(self) -> str:
        """The policy's weight dtype as TRL loads it (model_init_kwargs dtype; TRL's default float32)."""
        return _weight_dtype(self.args.model_init_kwargs, self.model)

    def through_dynamo(self, runs_on: RunsOn) -> bool:
        """Whether Dynamo traces the pass: torch_compile is on and TRL calls the module accelerate wrapped."""
        return self.args.compile_backend is not None and runs_on == "wrapped"

    def _compile_label_for(self, runs_on: RunsOn) -> str:
        """The one rule for a signature's `compile` label; "eager" means nothing compiles, nothing to warm."""
        if self.spec.target.backend == "neuron":
            return "neuron"  # TorchNeuron compiles eager ops and torch.compile graphs alike
        if not self.through_dynamo(runs_on):
            return "eager"  # Inductor compiles only what Dynamo traces
        return f"inductor:{self.args.compile_mode}" if self.args.compile_mode else "inductor"

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def need(self, loc: str, message: str) -> None:
        """A fact the plan cannot do without: the shapes that depend on it are not listed, and a plan left empty
        by it is refused with this message (an empty plan for a job that compiles would warm nothing)."""
        if all(p.loc != loc for p in self.missing):
            self.missing.append(FieldProblem(loc, message))

    def add(
        self,
        phase: Phase,
        batch: int,
        seq_len: int,
        cache_len: int | None = None,
        *,
        model: ModelFacts | None = None,
        gradient_checkpointing: bool | None = None,
        settings: dict[str, SettingValue] | None = None,
        runs_on: RunsOn = "wrapped",
    ) -> None:
        """Add one signature; graph settings come from the spec unless given.

        `runs_on` says which module TRL calls for this pass (see RunsOn); it decides the compile label.
        """
        if phase.startswith("generate_") != (runs_on == "generate"):
            raise ValueError(f"phase {phase} with runs_on {runs_on!r}: generate_* phases run inside generate")
        model = model or self.model
        if gradient_checkpointing is None:
            # Only the training forward checkpoints; forward-only passes turn it off (TRL does so for ref/old).
            gradient_checkpointing = phase == "train" and bool(self.args.gradient_checkpointing)
        signature = Signature(
            phase=phase,
            batch=batch,
            seq_len=seq_len,
            cache_len=cache_len,
            trainer=self.spec.trainer,
            model=model.config_hash,
            dtype=self.weight_dtype if model is self.model else _teacher_dtype(self.args, model),
            autocast=self.args.autocast,
            gradient_checkpointing=gradient_checkpointing,
            frozen=graph_hash(self.spec.peft) if self.spec.peft else None,
            compile=self._compile_label_for(runs_on),
            world_size=self.world_size,
            sharding=sharding_label(self.args.launch),
            settings=settings or {},
        )
        key = signature.key()
        if key not in self.signatures:
            if len(self.signatures) >= MAX_SIGNATURES:
                raise PlanTooLargeError(
                    f"the spec plans more than {MAX_SIGNATURES} signatures; set pad_to_multiple_of "
                    "(128 on Neuron) and data facts (max_tokens) so that the shapes are few",
                    loc="args.pad_to_multiple_of",
                )
            self.signatures[key] = signature
        if self.through_dynamo(runs_on):
            self.dynamo_keys.add(key)

    def add_many(self, phase: Phase, batches: Iterable[int], lengths: Iterable[int], **kwargs: Any) -> None:
        lengths = list(lengths)
        for batch in batches:
            for length in lengths:
                self.add(phase, batch, length, **kwargs)

    def build(self) -> Plan:
        ordered = sorted(
            self.signatures.values(),
            key=lambda s: (PHASE_ORDER[s.phase], s.model, s.batch, s.seq_len, s.cache_len or 0),
        )
        return Plan(signatures=ordered, warnings=list(self.warnings), notes=list(self.notes))


PHASE_ORDER = {
    phase: index
    for index, phase in enumerate(
        ("train", "old_logps", "ref", "teacher", "eval", "generate_prefill", "generate_decode")
    )
}


def _weight_dtype(model_init_kwargs: dict[str, Any] | None, model: ModelFacts) -> str:
    dtype = (model_init_kwargs or {}).get("dtype", "float32")
    if dtype in (None, "auto"):
        dtype = model.dtype or "float32"
    return str(dtype).removeprefix("torch.")


def _teacher_dtype(args: TrainerArgs, teacher: ModelFacts) -> str:
    return _weight_dtype(getattr(args.config, "teacher_model_init_kwargs", None), teacher)
