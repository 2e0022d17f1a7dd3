"""Step time: proportional to padded tokens, from a seed throughput or a measured step.

A forward + backward costs about 6 FLOPs per weight per token (2 forward, 4 backward), a forward-only pass 2;
the weights that count are the ones each token multiplies: every layer's projections and MLP (for a
mixture of experts, the active experts) and the LM head. Attention's own sequence-squared FLOPs are left
out, so step time is linear in padded tokens. The seed throughputs below are effective training FLOP/s
per process (peak bf16 times a typical utilisation); they are guesses, and a projection from them is an
estimate of the ratio between options more than of the absolute time. A measured step
(`step_seconds`: one optimizer step of the job as configured) replaces them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from warmup.job.model_facts import ModelFacts

# Effective training FLOP/s of one training process, per target device.
SEED_FLOPS = {
    # a trn2 logical NeuronCore at LNC=2: a quarter of the chip's 667 bf16 TFLOP/s, at about 35 % utilisation
    "neuron": 60e12,
    # an A100/H100-class GPU at the utilisation small-batch fine-tuning reaches
    "cuda": 100e12,
    # a many-core server CPU in float32
    "cpu": 0.5e12,
}


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Seconds per padded token of forward + backward on one process, and where the figure comes from."""

    seconds_per_token: float
    source: str

    @classmethod
    def seed(cls, model: ModelFacts, device: str) -> StepCosts:
        flops = training_flops_per_token(model)
        assumed = ""
        if flops is None:
            flops, assumed = 6 * 1e9, " (the config does not say its size: 1B weights assumed)"
        return cls(
            seconds_per_token=flops / SEED_FLOPS[device],
            source=(
                f"seed: {flops / 1e9:.2f} GFLOP per trained token{assumed} (6 x the weights a token meets) at "
                f"{SEED_FLOPS[device] / 1e12:g} TFLOP/s per {device} process; give step_seconds to calibrate"
            ),
        )

    @classmethod
    def measured(cls, step_seconds: float, work_per_step: float, measured_by: str = "") -> StepCosts:
        by = f" ({measured_by})" if measured_by else ""
        return cls(
            seconds_per_token=step_seconds / work_per_step,
            source=f"calibrated: {step_seconds:g} s per optimizer step of the job as configured{by}",
        )


def training_flops_per_token(model: ModelFacts) -> float | None:
    """6 x the weights one token multiplies, from the model's config (decoder-only transformers)."""
    config: dict[str, Any] = model.config.get("text_config") or model.config
    hidden = int(config.get("hidden_size") or config.get("d_model") or 0)
    layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
    vocab = int(config.get("vocab_size") or 0)
    if not (hidden and layers and vocab):
        return None  # not a decoder config this formula reads
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    experts = int(config.get("num_experts_per_tok") or 0)
    if experts and config.get("moe_intermediate_size"):
        mlp = experts * 3 * hidden * int(config["moe_intermediate_size"])
    else:
        mlp = 3 * hidden * int(config.get("intermediate_size") or 4 * hidden)  # gated MLP
    return 6.0 * (layers * (attention + mlp) + hidden * vocab)
