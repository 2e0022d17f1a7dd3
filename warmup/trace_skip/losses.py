"""Why a job keeps no trace, or only some of it: what its spec predicts, what torch's refusals mean for the
user, and the one line a rehearsal ends with."""

from __future__ import annotations

import logging
from typing import Any

from warmup._compat import kernels as compat_kernels
from warmup._compat import torch as compat_torch

log = logging.getLogger(__name__)

NO_BACKBONE = "the compiled model has no plain backbone to split (hooks on the backbone, or no base_model)"


# Parameter-sharded jobs: what torch does with the hooks that gather the parameters (warmup/planner/sharding.py)
SHARDED_PARAMETERS = (
    "{mode} shards the parameters and gathers each layer's in module hooks, which Dynamo leaves out of the graph "
    "(a break at every wrapped layer), so torch cannot keep the backbone as the one graph without breaks that "
    "aot_compile saves"
)
FSDP1_WRAPPER = (
    "{mode} runs each wrapped layer through FullyShardedDataParallel's own forward, whatever its sharding strategy, "
    "and does not run on CPU, where the trace skip is measured: not captured"
)


def predicted_loss(*, world_size: int, sharding: str | None = None) -> str | None:
    """Why a job keeps no trace, as far as its spec tells (`warmup plan`; the warm-up says it for certain).
    `sharding`: the signature's (`warmup.planner.sharding.sharding_label`). A DDP job keeps it: every rank runs
    the same backbone graph, and one rank's artifacts are checked on every rank before any is kept. So does a
    DeepSpeed job under ZeRO-1 or ZeRO-2 (and stage 0): parameters stay whole on every rank, gradients are
    reduced in parameter hooks outside any graph, and the engine compiles the model in place
    (`nn.Module.compile`), which the split hooks as it hooks torch.compile's wrapper."""
    if world_size == 1 or sharding is None:
        return None
    if sharding.startswith("fsdp2") or sharding == "zero3":
        return SHARDED_PARAMETERS.format(mode=sharding)
    if sharding.startswith("fsdp"):
        return FSDP1_WRAPPER.format(mode=sharding)
    return None


LOCAL_SCOPE = "defined in local scope"
# What torch's refusals mean for the user, by a phrase of its message (the first line of the message otherwise)
KNOWN_LOSSES = (
    (
        "torch.utils.checkpoint",
        "torch cannot trace a change of state inside non-reentrant gradient checkpointing (use_reentrant: "
        "false) as one graph (HOP: Unsafe side effect)",
    ),
    (
        LOCAL_SCOPE,
        "the model calls a function defined in a local scope (transformers' hub kernels, use_kernelized_func), "
        "which torch cannot save",
    ),
    (
        "returning intermediate with requires_grad_()",
        "with gradient checkpointing and a frozen embedding (not a PEFT model's, whose backbone is given the "
        "embeddings), transformers makes the embedding's output require grad inside the backbone "
        "(enable_input_require_grads), which torch cannot keep in one graph",
    ),
)


def hub_kernels_loss() -> str | None:
    """Why a model calling transformers' hub-kernel functions (Qwen3 and others, where `kernels` is installed)
    keeps no trace here, None where it keeps it: the seam to kernels does not hold on this version."""
    problems = compat_kernels.check()
    return f"{dict(KNOWN_LOSSES)[LOCAL_SCOPE]} ({problems[0]})" if problems else None


def hub_kernels_checkpoint_loss() -> str | None:
    """Why a job under gradient checkpointing of a model calling hub-kernel functions keeps no trace here (None
    where it keeps it, or `kernels` is not installed). kernels sets a context variable in each attention layer,
    inside the checkpoint (non-reentrant, the default from transformers 5.25 on); the split has torch trace that
    once, in the forward (`split.traced_under`), which needs that variable in kernels and that setting in torch."""
    if not compat_kernels.installed():
        return None
    problems = [*compat_kernels.check(), compat_torch.checkpoint_side_effects_problem()]
    problem = next((p for p in problems if p), None)
    if problem is None:
        return None
    why = dict(KNOWN_LOSSES)["torch.utils.checkpoint"]
    return f"{why}: kernels sets a context variable there ({problem})"


def loss_line(trace: list[dict[str, Any]], lost: str | None) -> str:
    """One line on what a rehearsal's trace skip did not keep ("" when it kept every call it recorded): its
    reason to keep none (`Recorder.lost`), or how many calls torch refused and why (`CaptureOutcome`)."""
    if lost:
        return f"trace skip off: {lost}"
    refused = [t for t in trace if not t.get("stored")]
    if not refused:
        return ""
    reason = str(refused[0].get("reason", ""))
    why = next((text for phrase, text in KNOWN_LOSSES if phrase in reason), reason.split("\n", 1)[0][:200])
    return f"trace not kept for {len(refused)} of {len(trace)} call(s): {why}"
