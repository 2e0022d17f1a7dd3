"""Signatures and plans: the units of compilation a training job will hit.

A signature is one compiled graph's identity: the phase that runs it, its tensor shapes, and the
graph-relevant settings (model config, dtype, gradient checkpointing, frozen parameters, compile
backend and mode, world size, trainer-specific switches). Its key is stable across processes and
machines; under one toolchain, one signature key has one entry of artifacts.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

Phase = Literal["train", "eval", "ref", "old_logps", "teacher", "generate_prefill", "generate_decode"]
PHASES: tuple[str, ...] = get_args(Phase)

PHASE_MEANING = {
    "train": "policy forward + backward (grad on, train mode)",
    "eval": "policy forward under evaluate() (no grad, eval mode)",
    "ref": "reference model forward (no grad)",
    "old_logps": "policy forward without grad in train mode (GRPO/RLOO old log-probs, KTO's KL batch)",
    "teacher": "teacher model forward (no grad)",
    "generate_prefill": "generation prefill over the padded prompt (static cache of cache_len)",
    "generate_decode": "one decode step (seq_len 1) against a static cache of cache_len",
}

SettingValue = str | int | float | bool | None


class Signature(BaseModel):
    """One unit of compilation. Field order is the JSON contract `warmup plan --format json` prints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase
    batch: PositiveInt = Field(description="Rows in the batch (DPO/Reward: 2 x per-device batch).")
    seq_len: PositiveInt = Field(description="Padded sequence length; 1 for a decode step.")
    cache_len: PositiveInt | None = Field(None, description="Static KV-cache length (generation only).")
    trainer: str = Field(description="TRL trainer kind whose code path calls the model.")
    model: str = Field(
        description="Hash of the config of the model this phase runs (policy, ref or teacher)."
    )
    dtype: str = Field(description="Weight dtype: float32, bfloat16 or float16.")
    autocast: str | None = Field(None, description="Mixed precision: bf16, fp16 or none.")
    gradient_checkpointing: bool = Field(False, description="Activation checkpointing inside this graph.")
    frozen: str | None = Field(None, description="Hash of the PEFT config freezing the base weights, if any.")
    compile: str = Field(
        description="Compile backend and mode: 'inductor', 'inductor:max-autotune', 'neuron', or 'eager' for a "
        "pass the target does not compile (listed because the job hits it; nothing to warm)."
    )
    world_size: PositiveInt = Field(1, description="Training processes; DDP changes the compiled graphs.")
    sharding: str | None = Field(
        None,
        description="The sharding wrapper the graphs are compiled under, where it changes them: 'fsdp2', 'fsdp1', "
        "'zero1', 'zero2', 'zero3', with ':ac' when FSDP checkpoints activations (docs/multi-node.md); None under DDP "
        "or one process.",
    )
    settings: dict[str, SettingValue] = Field(
        default_factory=dict,
        description="Trainer switches that change the graph (loss_type, padding_free, ...).",
    )

    def key(self) -> str:
        """sha256 of the canonical JSON of every field: the signature's identity."""
        # Only Signature's own fields: a subclass adding fields (the API's PlannedSignature) keeps the key.
        own = self.model_dump(mode="json", include=set(Signature.model_fields), by_alias=False)
        if own["sharding"] is None:  # added later: a job without it keeps the key it always had
            del own["sharding"]
        canonical = json.dumps(own, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def shape_label(self) -> str:
        """Short human label, e.g. `train 4x256` or `generate_decode 8x1 cache 639`."""
        label = f"{self.phase} {self.batch}x{self.seq_len}"
        return f"{label} cache {self.cache_len}" if self.cache_len is not None else label


class Plan(BaseModel):
    """Spec -> the exact set of signatures the job will hit, plus what could not be enumerated."""

    model_config = ConfigDict(frozen=True)

    signatures: list[Signature]
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(
        default_factory=list,
        description="What the warm-up does differently from the job, and why (no action needed).",
    )

    def keys(self) -> list[str]:
        return [signature.key() for signature in self.signatures]
