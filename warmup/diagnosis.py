"""Why a training run compiled: the nearest warmed entry, and the fields that differ from it.

A compile during training has one of three causes, and each has its own fix:
- the spec is wrong: the run's model differs from what the spec says (dtype, mixed precision,
  gradient checkpointing, which parameters train), so the warmed graphs are not the ones training
  builds;
- the run is not the spec's: its arguments that shape the batches (the batch size, the lengths) differ
  from the spec's, so it meets shapes the spec's plan cannot list;
- the plan is wrong, or the cache incomplete: the data reaches a shape the plan did not list, or
  the plan listed it and the pulled cache does not hold it (--allow-partial, a failed warm-up);
- the environment is wrong: the toolchain this process computed differs from the one the cache was
  pulled for (`warmup.pod.activation.verify_pulled_toolchain`).

`diagnose` compares what ran with the warmed signatures and names the nearest one and the fields that
differ, so a coverage report and the callback's warning say which. Pod-side: no torch, no TRL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from warmup.signature import Signature

# The graph-relevant settings a training process can observe on its own model, by signature field.
OBSERVED_FIELDS = ("dtype", "autocast", "gradient_checkpointing", "frozen")
# The trainer arguments that decide the shapes of the batches: a run whose values differ from its spec's
# meets shapes the plan of the spec cannot list, and the warm-up of that spec cannot produce.
SHAPE_ARGS = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "max_length",
    "max_prompt_length",
    "max_completion_length",
    "num_generations",
    "pad_to_multiple_of",
)


@dataclass(frozen=True)
class RunFacts:
    """What the training process observed of its own model and arguments (None: not observed)."""

    dtype: str | None = None  # of the model's first parameter: float32, bfloat16, float16
    autocast: str | None = None  # bf16, fp16, or None
    gradient_checkpointing: bool | None = None
    frozen: bool | None = None  # some parameters do not train (PEFT, a frozen base)
    # SHAPE_ARGS whose value in the run differs from the spec's: {name: (the spec's, the run's)}
    args: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)


def args_differences(spec_args: Mapping[str, Any], run_args: Any) -> dict[str, tuple[Any, Any]]:
    """{name: (the spec's, the run's)} for each of SHAPE_ARGS the run sets otherwise than its spec. A field
    the spec leaves out is the default of the run's own config class (the trainer's, as `trl` fills it); a
    value `trl` resolves on the device (`pad_to_multiple_of: auto`) is not compared."""
    defaults = getattr(type(run_args), "__dataclass_fields__", {})
    found: dict[str, tuple[Any, Any]] = {}
    for name in SHAPE_ARGS:
        if not hasattr(run_args, name):
            continue
        given = spec_args[name] if name in spec_args else getattr(defaults.get(name), "default", None)
        ours = getattr(run_args, name)
        if isinstance(given, str) or not isinstance(ours, int | type(None)):
            continue
        if given != ours:
            found[name] = (given, ours)
    return found


@dataclass(frozen=True)
class Diagnosis:
    """Why `label` compiled: the nearest warmed signature and {field: (warmed, this run)}."""

    label: str
    planned: bool
    warmed: bool
    nearest: str | None
    nearest_key: str | None
    differs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    args: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)  # RunFacts.args

    @property
    def cause(self) -> str:
        """Which of spec, plan (or cache) and environment is wrong, in a sentence."""
        toolchain = sorted(name for name in self.differs if name.startswith("toolchain."))
        settings = [name for name in self.differs if name in OBSERVED_FIELDS]
        if toolchain:
            return (
                f"the environment differs from the cache's ({', '.join(toolchain)}): the cache was pulled "
                "for another toolchain"
            )
        if settings:
            return (
                f"the run's model differs from the spec's ({', '.join(settings)}): fix the spec (or the "
                "training script) so that the warm-up builds the graphs training builds"
            )
        if not self.planned and self.args:
            named = ", ".join(
                f"{name} {ours!r} (the spec: {theirs!r})" for name, (theirs, ours) in self.args.items()
            )
            return (
                f"the run's arguments differ from the spec's: {named}; the spec warms the shapes of its own "
                "arguments, so run with the spec's values, or warm a spec of the run's"
            )
        if not self.planned:
            return (
                "the plan did not list this shape: the data reaches lengths the spec's data facts do not "
                "(fix the spec's data facts or padding, or let the service warm it for the next run)"
            )
        if not self.warmed:
            return (
                "the plan listed it but the cache does not hold it (pulled with --allow-partial, or its "
                "warm-up failed: `warmup pull --wait` installs it once warm)"
            )
        return (
            "the cache holds this signature and nothing the callback observes differs: a compile-relevant "
            "setting outside the signature changed (see docs/compile-caches.md)"
        )

    def sentence(self) -> str:
        nearest = f"nearest warmed entry: {self.nearest}" if self.nearest else "no entry is warmed"
        differs = "; ".join(
            f"{name} {warmed!r} warmed vs {ours!r} here" for name, (warmed, ours) in self.differs.items()
        )
        return f"{nearest}{f' ({differs})' if differs else ''}; {self.cause}"

    def as_json(self) -> dict[str, Any]:
        return {
            "nearest": self.nearest,
            "nearest_key": self.nearest_key,
            "differs": {
                name: {"warmed": warmed, "run": ours} for name, (warmed, ours) in self.differs.items()
            },
            "planned": self.planned,
            "warmed": self.warmed,
            "args": {name: {"spec": theirs, "run": ours} for name, (theirs, ours) in self.args.items()},
            "cause": self.cause,
        }


def diagnose(
    shape: tuple[str, int, int],
    signature: Signature | None,
    warmed: Iterable[Signature],
    facts: RunFacts,
    *,
    planned: bool,
    toolchain_differences: Mapping[str, tuple[Any, Any]] | None = None,
) -> Diagnosis:
    """Compare what ran (`shape`, the signature planned or derived for it, the model `facts`) with the
    `warmed` signatures: the nearest (same phase first, then fewest differing fields, then closest
    shape) and every field that differs from it. Toolchain differences are named `toolchain.FIELD`."""
    phase, batch, seq_len = shape
    label = f"{phase} {batch}x{seq_len}"
    ran: dict[str, Any] = {"batch": batch, "seq_len": seq_len}
    observed = {name: getattr(facts, name) for name in OBSERVED_FIELDS}
    candidates = list(warmed)
    key = signature.key() if signature is not None else None
    is_warmed = key is not None and any(s.key() == key for s in candidates)

    def differences(entry: Signature) -> dict[str, tuple[Any, Any]]:
        found: dict[str, tuple[Any, Any]] = {}
        if entry.phase != phase:
            found["phase"] = (entry.phase, phase)
        for name, value in ran.items():
            if getattr(entry, name) != value:
                found[name] = (getattr(entry, name), value)
        for name, value in observed.items():
            if value is None:
                continue
            theirs: Any = getattr(entry, name)
            if name == "frozen":
                theirs = theirs is not None  # a PEFT hash in the signature: some parameters frozen
            if name == "gradient_checkpointing" and entry.phase != "train":
                continue  # only the training graph recomputes activations
            if theirs != value:
                found[name] = (theirs, value)
        return found

    ranked = sorted(
        candidates,
        key=lambda entry: (
            entry.phase != phase,
            len(differences(entry)),
            abs(entry.seq_len - seq_len) + abs(entry.batch - batch),
        ),
    )
    nearest = ranked[0] if ranked else None
    differs = differences(nearest) if nearest is not None else {}
    for name, (ours, theirs) in sorted((toolchain_differences or {}).items()):
        differs[f"toolchain.{name}"] = (theirs, ours)
    return Diagnosis(
        label=label,
        planned=planned,
        warmed=is_warmed,
        nearest=nearest.shape_label if nearest is not None else None,
        nearest_key=nearest.key() if nearest is not None else None,
        differs=differs,
        args=dict(facts.args),
    )
