"""GRPO and RLOO: generation, then training over the prompt x completion grid. docs/trl-shapes.md section 6.

One generation round in TRL 1.16 (`_prepare_inputs`, `_generate_and_score_completions`):

- the local generation batch (per_device_train_batch_size x steps_per_generation rows) is left-padded to
  ceil_m(longest prompt in the batch) and passed to `generate` (prefill, then one decode step per token);
- prompts and completions are re-padded over that whole batch, so every micro-batch of the round has the
  same width P + C;
- the forward-only passes (old log-probs, reference) run over it in chunks of per_device_train_batch_size
  rows, then each micro-batch of per_device_train_batch_size rows trains.

Evaluation does the same per eval batch: generate, the forward-only passes, then the loss without grad.

Under torch.compile on Inductor only the training forward and a separate reference model's forwards (accelerate
prepared it at init) compile: generation runs eager (`disable_compile=True`), and TRL computes the old log-probs on
`self.model`, the bare policy, as it does the PEFT reference and as transformers' evaluation loop calls it.

The generation helpers here are shared with the distillation planner. The spec cannot express the
trainer's `tools`, `environment_factory`, `rollout_func` or model-based reward functions (they are
trainer arguments, not config fields); the plan assumes none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from warmup.planner.common import (
    PlanBuilder,
    RunsOn,
    evaluates,
    full_batch_reachable,
    padded_lengths,
    partial_batch,
)
from warmup.signature import SettingValue

# transformers' generation/configuration_utils.py ALL_STATIC_CACHE_IMPLEMENTATIONS (5.24): a StaticCache.
STATIC_CACHES = frozenset(
    {
        "static",
        "offloaded_static",
        "sliding_window",
        "hybrid",
        "hybrid_chunked",
        "offloaded_hybrid",
        "offloaded_hybrid_chunked",
    }
)
# DYNAMIC_CACHE_IMPLEMENTATIONS, plus None (the default): a cache that grows by one token per step.
DYNAMIC_CACHES = frozenset({None, "dynamic", "offloaded", "quantized"})


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """The padded lengths a generation round can produce."""

    prompts: list[int]  # padded prompt lengths P (generation input and training prefix)
    completions: list[int]  # padded completion lengths C
    max_new_tokens: int  # M: generate stops after M new tokens
    step: int | None = None  # the padding multiple both length lists step by (None: 1)

    @property
    def sequences(self) -> list[int]:
        """Widths P + C of the training and forward-only passes.

        Both lists step by the padding multiple (or by 1), so their sums are every step from the smallest
        sum to the largest: computed without the P x C pairs (millions for unpadded lengths).
        """
        if not self.prompts or not self.completions:
            return []
        step = self.step or 1
        return list(
            range(self.prompts[0] + self.completions[0], self.prompts[-1] + self.completions[-1] + 1, step)
        )


def plan_grpo(plan: PlanBuilder) -> None:
    args = plan.args
    # grpo_trainer.py `_generate_and_score_completions`: old log-probs only when a generated batch outlives an
    # optimizer step, GA % (steps_per_generation x num_iterations) != 0, or to correct vLLM's sampling.
    generate_every = args.steps_per_generation * args.num_iterations
    old_logps = args.gradient_accumulation_steps % generate_every != 0 or bool(
        args.use_vllm and args.vllm_importance_sampling_correction
    )
    forward: dict[str, SettingValue] = {
        "temperature": args.temperature,
        "cast_lm_head_to_fp32": bool(args.cast_lm_head_to_fp32),
    }
    loss: dict[str, SettingValue] = {
        "loss_type": args.loss_type,
        "importance_sampling_level": args.importance_sampling_level,
    }
    _warn_tools(plan)
    _plan_policy_optimization(plan, forward=forward, loss=loss, old_logps=old_logps)


def plan_rloo(plan: PlanBuilder) -> None:
    # rloo_trainer.py `_generate_and_score_completions` computes the old log-probs on every round.
    forward: dict[str, SettingValue] = {"temperature": plan.args.temperature}
    _plan_policy_optimization(plan, forward=forward, loss={}, old_logps=True)


def _plan_policy_optimization(
    plan: PlanBuilder,
    *,
    forward: dict[str, SettingValue],
    loss: dict[str, SettingValue],
    old_logps: bool,
) -> None:
    args = plan.args
    rollouts = rollout_lengths(plan)
    if rollouts is None:
        return
    train_rows = args.per_device_train_batch_size
    eval_rows = eval_batches(plan, copies_per_prompt=args.num_generations_eval or args.num_generations)
    plan_generation(plan, [train_rows * args.steps_per_generation, *eval_rows], rollouts)

    # The policy's fused LM head returns log-probs and entropies; the reference's only log-probs.
    policy = {**forward, "lm_head_outputs": "log_probs,entropy"}
    widths = rollouts.sequences
    plan.add_many("train", [train_rows], widths, settings={**policy, **loss})
    if old_logps:
        plan.add_many("old_logps", [train_rows], widths, settings=policy, runs_on="bare")
    # In eval the old log-probs pass runs in eval mode on the eval batch: the same graph as the eval loss forward.
    plan.add_many("eval", eval_rows, widths, settings={**policy, **loss}, runs_on="bare")
    if args.beta != 0.0:
        reference = {**forward, "lm_head_outputs": "log_probs"}
        # With PEFT there is no reference copy: TRL runs the bare policy with its adapter disabled.
        runs_on: RunsOn = "bare" if plan.spec.peft else "wrapped"
        plan.add_many("ref", [train_rows, *eval_rows], widths, settings=reference, runs_on=runs_on)


def rollout_lengths(plan: PlanBuilder) -> Rollouts | None:
    """Prompt and completion buckets from the data facts and the generation length; None if unbounded."""
    data = plan.data
    m = plan.multiple
    # Prompts are never truncated (TRL 1.16 has no max_prompt_length): only the data bounds them.
    longest_prompt = data.max_prompt_tokens or data.max_tokens
    if longest_prompt is None:
        plan.need(
            "data.max_prompt_tokens",
            "the longest prompt is not known, and TRL does not truncate prompts (there is no max_prompt_length "
            "since TRL 0.29): give the data facts with --dataset PATH (the prompts are tokenized as the trainer "
            "does), or data.max_prompt_tokens (the longest chat-templated prompt) in the side file",
        )
        return None
    max_new_tokens = _generation_kwargs(plan).get("max_new_tokens", plan.args.max_completion_length)
    if max_new_tokens is None:
        plan.need(
            "args.max_completion_length",
            "max_completion_length is None: generation stops only at the model's own max_length, so completion "
            "lengths cannot be listed; set max_completion_length",
        )
        return None
    shortest_prompt = min(data.min_prompt_tokens or 1, longest_prompt)
    # A completion ends at its first EOS (kept), so one token is the shortest unless min_new_tokens holds it.
    shortest_completion = min(max(_generation_kwargs(plan).get("min_new_tokens") or 1, 1), max_new_tokens)
    return Rollouts(
        prompts=padded_lengths(shortest_prompt, longest_prompt, m),
        completions=padded_lengths(shortest_completion, max_new_tokens, m),
        max_new_tokens=max_new_tokens,
        step=m,
    )


def eval_batches(plan: PlanBuilder, *, copies_per_prompt: int) -> list[int]:
    """Rows of the eval batches: full per_device_eval_batch_size batches and a short last one."""
    if not evaluates(plan):
        return []
    args = plan.args
    batch = args.per_device_eval_batch_size
    examples = plan.data.num_eval_examples
    rows = examples * copies_per_prompt if examples is not None else None
    batches = [batch] if full_batch_reachable(rows, batch, plan.world_size) else []
    remainder = partial_batch(rows, batch, drop_last=args.dataloader_drop_last, world_size=plan.world_size)
    if remainder:
        batches.append(remainder)
    elif rows is None and not args.dataloader_drop_last and plan.world_size == 1:
        plan.warn(
            f"the last eval batch is shorter than {batch} rows unless the eval rows divide evenly: give "
            "data.num_eval_examples (or set dataloader_drop_last: true) to list it"
        )
    return batches


def plan_generation(plan: PlanBuilder, batches: Iterable[int], rollouts: Rollouts) -> None:
    """Prefill and decode signatures of `generate` for each generation batch size."""
    args = plan.args
    kwargs = _generation_kwargs(plan)
    if getattr(args, "use_vllm", False):
        mode = getattr(args, "vllm_mode", "colocate")
        plan.warn(
            f"use_vllm ({mode} mode): generation runs in vLLM, which compiles its own graphs (torch.compile over "
            "a symbolic batch size, cached under VLLM_CACHE_ROOT/torch_compile_cache, plus CUDA graphs captured "
            "at start-up and never cached); this plan lists the trainer's own forwards, which the warm-up "
            "rehearses with generation through transformers (the training graphs do not depend on who generated)"
        )
        plan.warn(
            "vLLM's own compile cache is a separate artifact set, unverified: "
            + (
                "in server mode it belongs to the vLLM server's process, which this warm-up does not start"
                if mode == "server"
                else "a colocate rehearsal on a worker with vLLM installed keeps use_vllm and points "
                "VLLM_CACHE_ROOT into the entry (warmup exec and warmup.activate set it in the job); where vLLM is not "
                "installed it is not warmed and vLLM compiles at start-up"
            )
        )
        return
    if getattr(args, "use_transformers_continuous_batching", False):
        plan.warn(
            "use_transformers_continuous_batching: paged generation packs a data-dependent number of tokens per "
            "step, which cannot be listed; turn it off and use cache_implementation: static"
        )
        return
    if kwargs.get("use_cache") is False:
        plan.warn(
            "generation_kwargs.use_cache is false: every decode step re-runs the whole sequence (N, P + t), a new "
            "shape per token, which cannot be listed; drop use_cache: false and use cache_implementation: static"
        )
        return
    if (kwargs.get("num_beams") or 1) > 1 or (kwargs.get("num_return_sequences") or 1) > 1:
        plan.warn(
            "generation_kwargs num_beams / num_return_sequences > 1 multiply the generation batch; generation "
            "shapes are not listed: sample one sequence per row as TRL expects"
        )
        return
    if kwargs.get("prefill_chunk_size"):
        plan.warn(
            "generation_kwargs.prefill_chunk_size splits the prefill into chunks this plan does not list; drop it"
        )
        return
    implementation = kwargs.get("cache_implementation", args.cache_implementation)
    batches = sorted(set(batches))
    if implementation in STATIC_CACHES:
        _static_cache_generation(plan, batches, rollouts, implementation)
    elif implementation in DYNAMIC_CACHES:
        _dynamic_cache_generation(plan, batches, rollouts, implementation)
    else:
        plan.warn(
            f"cache_implementation {implementation!r} is not a static or dynamic cache transformers knows: "
            "generation shapes are not listed; use cache_implementation: static"
        )


def _static_cache_generation(
    plan: PlanBuilder, batches: list[int], rollouts: Rollouts, implementation: str
) -> None:
    """One StaticCache per generate call, of length max(P + M - 1, max_cache_len, every earlier call's length).

    transformers `_prepare_static_cache` keeps the largest length on the model (`_previous_max_cache_length`),
    so the sizes ratchet up over the run, across train and eval: any prompt bucket's P + M - 1 can be met
    first, and later calls with shorter prompts reuse the larger cache (prefill included).
    """
    pinned = _generation_kwargs(plan).get("max_cache_len") or 0
    first_size = {p: max(pinned, p + rollouts.max_new_tokens - 1) for p in rollouts.prompts}
    sizes = sorted(set(first_size.values()))
    settings: dict[str, SettingValue] = {"cache_implementation": implementation}
    for rows in batches:
        for prompt, smallest in first_size.items():
            for size in sizes:
                if size >= smallest:
                    plan.add("generate_prefill", rows, prompt, size, settings=settings, runs_on="generate")
        if rollouts.max_new_tokens > 1:  # the first new token comes from the prefill
            for size in sizes:
                plan.add("generate_decode", rows, 1, size, settings=settings, runs_on="generate")
    if plan.spec.target.backend != "neuron":
        return
    if len(sizes) > 1:
        plan.warn(
            f"the static cache length ratchets with the longest prompt bucket seen so far: {len(sizes)} cache "
            f"sizes ({', '.join(map(str, sizes))}), each a long Neuron compile for every prefill and decode "
            f"graph; pin one with generation_kwargs: {{max_cache_len: {sizes[-1]}}}"
        )
    if plan.weight_dtype == "float32" and plan.args.autocast:
        plan.warn(
            "static cache with float32 weights under bf16/fp16 autocast: keys and values reach the cache in "
            "different dtypes (float32 keys, half-precision values); load the model in bfloat16 "
            "(model_init_kwargs: {dtype: bfloat16})"
        )


def _dynamic_cache_generation(
    plan: PlanBuilder, batches: list[int], rollouts: Rollouts, implementation: str | None
) -> None:
    """A DynamicCache grows by one token per decode step: only the prefill, from an empty cache, is fixed."""
    settings: dict[str, SettingValue] = {"cache_implementation": implementation or "dynamic"}
    # cache_len None: the prefill starts from an empty dynamic cache, so (rows, P) alone fixes its graph.
    plan.add_many("generate_prefill", batches, rollouts.prompts, settings=settings, runs_on="generate")
    if plan.spec.target.backend != "neuron":
        return  # under Inductor TRL's generation runs eager: nothing to compile either way
    longest = rollouts.prompts[-1] + rollouts.max_new_tokens - 1
    kv_lengths = longest - rollouts.prompts[0]
    plan.warn(
        f"dynamic KV cache (cache_implementation {implementation!r}): every decode step has a new KV length "
        f"(up to {kv_lengths} per generation batch size), which cannot be listed or warmed; only the prefill "
        f"shapes are listed. Set cache_implementation: static and generation_kwargs: "
        f"{{max_cache_len: {longest}}}"
    )


def _warn_tools(plan: PlanBuilder) -> None:
    if getattr(plan.args, "max_tool_calling_iterations", None) is not None:
        plan.warn(
            "max_tool_calling_iterations is set: with tools or an environment, tool turns re-generate for "
            "data-dependent rows with data-dependent prompt lengths, which cannot be listed"
        )


def _generation_kwargs(plan: PlanBuilder) -> dict[str, Any]:
    return dict(getattr(plan.args, "generation_kwargs", None) or {})
