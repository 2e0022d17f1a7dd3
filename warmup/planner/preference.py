"""DPO, KTO and Reward: docs/trl-shapes.md section 5, checked against TRL 1.16.0's sources.

Data facts for preference data are per row, a row being what the model sees: prompt + chosen and
prompt + rejected (DPO, Reward), prompt + completion (KTO), templated and tokenized as TRL does
(EOS included). So `max_tokens` / `min_tokens` bound every row and `length_histogram` counts rows
(two per DPO / Reward example). `num_*_examples` count examples: pairs for DPO and Reward, unpaired
examples for KTO (TRL unpairs a paired dataset into two examples per pair). KTO's KL rows pair a
prompt with another example's completion, so they are bounded by `min/max_prompt_tokens` when
given, and otherwise by the widest split of the rows into prompt + completion.

Shapes, with B the per-device batch and L = ceil_m(longest row of the batch):

- DPO (dpo_trainer.py DataCollatorForPreference): chosen rows stacked over rejected rows, (2B, L),
  each row truncated to max_length; examples whose prompt alone is >= max_length are dropped
  (keep_start only). Every step runs the policy forward + backward and a reference forward of the
  same shape, unless precompute_ref_log_probs: then the reference runs once over each split before
  training (its own DataLoader: precompute_ref_batch_size or the per-device batch, no shuffle, a
  short last batch whatever dataloader_drop_last says). padding_free is ignored (TRL warns).
- KTO (kto_trainer.py): main rows (B, L_main) and, unless loss_type is apo_zero_unpaired, KL rows
  (B, L_KL) built by rotating completions within groups of per_device_train_batch_size. Per step:
  policy KL forward without grad (phase old_logps), policy main forward + backward, reference main
  and KL forwards. Evaluation runs the policy over both, as the eval phase.
- Reward (reward_trainer.py): (2B, L) on the model loaded as *ForSequenceClassification with one
  label; pairs with a row longer than max_length are dropped, not truncated.

Short last batches (n % B) occur in a single process with dataloader_drop_last off; with several
processes accelerate's even_batches fills them.

Which model a signature names: always the policy's config. The reference model TRL builds is a
copy of the policy (same checkpoint, dtype and attention), so it compiles to the same graphs as
any copy; what tells reference graphs apart is the phase and `settings["reference"]`:
"ref_model" (the separate copy, eval mode, log-probs only), "policy" (precompute on the policy
itself before training) or "policy_adapter_disabled" (PEFT: the policy with its adapter off,
in the mode of the loop that calls it).

What compiles under torch.compile on Inductor: only the modules accelerate prepared, which are the
policy as the Trainer wraps it when training starts (the training forward, and KTO's KL forward) and the
separate reference copy (prepared at init, so its forwards compile in the training loop and in evaluate()
alike). The bare policy runs eagerly wherever it is called: precompute (in __init__, before the policy
is wrapped), the PEFT reference (TRL calls `self.model`) and evaluation (transformers 5.24's
evaluation_loop uses `self.model` once a model is prepared). Those passes are listed all the same, labelled
`compile="eager"` (nothing to warm); on Neuron every pass compiles, eager ops included.
"""

from __future__ import annotations

from warmup.errors import SpecError
from warmup.planner.common import (
    PlanBuilder,
    RunsOn,
    evaluates,
    full_batch_reachable,
    padded_lengths,
    partial_batch,
    smallest_batch_max,
)
from warmup.signature import Phase, SettingValue

Settings = dict[str, SettingValue]

# DPO's f-divergences other than reverse_kl only generalize these losses (DPOTrainer.__init__).
F_DIVERGENCE_LOSS_TYPES = {"sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft"}


# --- DPO ------------------------------------------------------------------------------------------


def plan_dpo(plan: PlanBuilder) -> None:
    args = plan.args
    _check_reference(plan)
    _check_dpo_losses(plan)
    if args.padding_free:
        plan.warn(
            "padding_free is ignored by DPOTrainer in TRL 1.16 (it warns and pads): the plan lists padded "
            "batches; set padding_free: false to silence TRL's warning"
        )
    _warn_vision(plan)
    longest = _longest_row(plan)
    if longest is None:
        return
    if args.truncation_mode == "keep_start":
        _warn_prompts_dropped(plan)
    policy: Settings = {
        **_common_settings(plan),
        "loss_type": ",".join(args.loss_type),
        "f_divergence_type": args.f_divergence_type,
        "ld_alpha": args.ld_alpha,
        "use_weighting": bool(args.use_weighting),  # adds an output to the fused LM head
        "output_router_logits": _router_aux_loss(plan),
    }
    reference = _Reference(plan, policy_outputs={"use_weighting": bool(args.use_weighting)})

    def lengths(examples: int) -> list[int]:
        return _lengths(plan, 2 * examples, longest)  # chosen and rejected rows

    precompute = bool(args.precompute_ref_log_probs)
    train_batch = args.per_device_train_batch_size
    for examples in _batch_sizes(plan, train_batch, "train", drop_last=args.dataloader_drop_last):
        plan.add_many("train", [2 * examples], lengths(examples), settings=policy)
        if not precompute:
            reference.add([2 * examples], lengths(examples), training=True)
    if precompute:
        for examples in _batch_sizes(
            plan, args.precompute_ref_batch_size or train_batch, "train", precompute=True
        ):
            reference.add_precompute([2 * examples], lengths(examples))

    if not evaluates(plan):
        return
    eval_batch = args.per_device_eval_batch_size
    for examples in _batch_sizes(plan, eval_batch, "eval", drop_last=args.dataloader_drop_last):
        plan.add_many("eval", [2 * examples], lengths(examples), settings=policy, runs_on="bare")
        if not precompute:
            reference.add([2 * examples], lengths(examples), training=False)
    if precompute:
        for examples in _batch_sizes(
            plan, args.precompute_ref_batch_size or eval_batch, "eval", precompute=True
        ):
            reference.add_precompute([2 * examples], lengths(examples))


def _check_dpo_losses(plan: PlanBuilder) -> None:
    """The loss combinations DPOTrainer.__init__ refuses."""
    args = plan.args
    losses = set(args.loss_type)
    if args.f_divergence_type != "reverse_kl" and not losses <= F_DIVERGENCE_LOSS_TYPES:
        raise SpecError(
            f"f_divergence_type {args.f_divergence_type!r} only works with the losses "
            f"{sorted(F_DIVERGENCE_LOSS_TYPES)}; use f_divergence_type: reverse_kl with {sorted(losses)}",
            loc="args.f_divergence_type",
        )
    if args.use_weighting and losses & {"aot", "aot_unpaired"}:
        raise SpecError(
            "use_weighting is not implemented for the aot / aot_unpaired losses (they sort samples)",
            loc="args.use_weighting",
        )
    if "exo_pair" in losses and args.label_smoothing == 0.0:
        raise SpecError(
            "the exo_pair loss needs label_smoothing > 0 (the paper uses 1e-3)", loc="args.label_smoothing"
        )


# --- KTO ------------------------------------------------------------------------------------------


def plan_kto(plan: PlanBuilder) -> None:
    args = plan.args
    train_batch = args.per_device_train_batch_size
    kl = args.loss_type != "apo_zero_unpaired"
    if kl and args.train_sampling_strategy != "sequential":
        raise SpecError(
            f"loss_type {args.loss_type!r} estimates a KL term from neighbouring examples and TRL requires "
            "train_sampling_strategy: sequential (the default)",
            loc="args.train_sampling_strategy",
        )
    if kl and train_batch <= 1:
        raise SpecError(
            f"loss_type {args.loss_type!r} needs per_device_train_batch_size > 1 (the KL term pairs examples "
            "within a batch)",
            loc="args.per_device_train_batch_size",
        )
    _check_reference(plan)
    _warn_vision(plan)
    longest = _longest_row(plan)
    if longest is None:
        return
    _warn_prompts_dropped(plan)
    kl_low, kl_high = _kl_row_range(plan, longest)
    main: Settings = {
        **_common_settings(plan),
        "loss_type": args.loss_type,
        "output_router_logits": _router_aux_loss(plan),
    }
    kl_settings = {**main, "output_router_logits": False}  # the KL forward never asks for router logits
    reference = _Reference(plan, policy_outputs={})

    def main_lengths(rows: int) -> list[int]:
        return _lengths(plan, rows, longest)

    def kl_lengths(rows: int, full: int, num_examples: int | None) -> list[int]:
        if _alone_in_kl_group(plan, rows, full, num_examples):
            return main_lengths(rows)  # rotating a group of one gives the example its own completion
        return padded_lengths(min(kl_low, kl_high), kl_high, plan.multiple)

    def passes(split: str, batch: int, *, precompute: bool = False) -> None:
        num_examples = _num_examples(plan, split)
        drop_last = False if precompute else args.dataloader_drop_last
        for rows in _batch_sizes(plan, batch, split, drop_last=drop_last, precompute=precompute):
            main_len = main_lengths(rows)
            kl_len = kl_lengths(rows, batch, num_examples) if kl else []
            if precompute:
                reference.add_precompute([rows], main_len + kl_len)
                continue
            if split == "train":
                plan.add_many("train", [rows], main_len, settings=main)
                plan.add_many("old_logps", [rows], kl_len, settings=kl_settings)
            else:
                plan.add_many("eval", [rows], main_len, settings=main, runs_on="bare")
                plan.add_many("eval", [rows], kl_len, settings=kl_settings, runs_on="bare")
            if not args.precompute_ref_log_probs:
                reference.add([rows], main_len + kl_len, training=split == "train")

    passes("train", train_batch)
    if args.precompute_ref_log_probs:
        passes("train", args.precompute_ref_batch_size or train_batch, precompute=True)
    if evaluates(plan):
        eval_batch = args.per_device_eval_batch_size
        passes("eval", eval_batch)
        if args.precompute_ref_log_probs:
            passes("eval", args.precompute_ref_batch_size or eval_batch, precompute=True)


def _kl_row_range(plan: PlanBuilder, longest: int) -> tuple[int, int]:
    """Shortest and longest KL row: one example's prompt + another's completion, truncated at max_length."""
    data = plan.data
    max_length = plan.args.max_length
    if data.longest is None:
        return 1, longest
    shortest = data.shortest or 1
    # A completion is at least one token (TRL appends EOS); a prompt >= max_length drops its example.
    min_prompt = data.min_prompt_tokens or 0
    max_prompt = data.max_prompt_tokens if data.max_prompt_tokens is not None else data.longest - 1
    if max_length is not None:
        max_prompt = min(max_prompt, max_length - 1)
    max_completion = data.longest - min_prompt
    min_completion = max(1, shortest - max_prompt)
    low, high = min_prompt + min_completion, max_prompt + max_completion
    if max_length is not None:
        low, high = min(low, max_length), min(high, max_length)
    if data.max_prompt_tokens is None and high > longest:
        plan.warn(
            "KTO's KL rows join one example's prompt to another's completion, so without data.max_prompt_tokens "
            f"they are bounded by {high} tokens, above the longest example ({longest}); give "
            "data.min_prompt_tokens / max_prompt_tokens to list fewer KL lengths"
        )
    return low, high


def _alone_in_kl_group(plan: PlanBuilder, rows: int, full: int, num_examples: int | None) -> bool:
    """Whether a batch is the one-row last batch whose example is alone in its KL rotation group.

    TRL rotates completions within consecutive groups of per_device_train_batch_size examples (one
    `datasets.map` batch each; several map processes restart the groups at each shard).
    """
    if rows != 1 or full == 1 or num_examples is None or (plan.args.dataset_num_proc or 1) > 1:
        return False
    batch: int = plan.args.per_device_train_batch_size
    return num_examples % batch == 1


# --- Reward ---------------------------------------------------------------------------------------


def plan_reward(plan: PlanBuilder) -> None:
    args = plan.args
    if "vision_config" in plan.model.config:
        plan.warn("RewardTrainer has no vision path in TRL 1.16: the plan covers text-only data")
    longest = _longest_row(plan)
    if longest is None:
        return
    shortest = plan.data.shortest
    if args.max_length is not None and shortest is not None and shortest > args.max_length:
        raise SpecError(
            f"every row is longer than max_length ({args.max_length}), and RewardTrainer drops such pairs: "
            "raise max_length or check data.min_tokens",
            loc="args.max_length",
        )
    if args.max_length is not None and (plan.data.longest is None or plan.data.longest > args.max_length):
        _warn_examples_dropped(plan, f"a pair with a row longer than max_length ({args.max_length})")
    settings: Settings = {
        **_common_settings(plan),
        "center_rewards": args.center_rewards_coefficient is not None,
    }
    splits: tuple[tuple[Phase, int], ...] = (
        ("train", args.per_device_train_batch_size),
        ("eval", args.per_device_eval_batch_size),
    )
    for split, batch in splits:
        if split == "eval" and not evaluates(plan):
            return
        runs_on: RunsOn = "wrapped" if split == "train" else "bare"  # evaluate() calls the bare model
        for examples in _batch_sizes(plan, batch, split, drop_last=args.dataloader_drop_last):
            rows = 2 * examples
            plan.add_many(split, [rows], _lengths(plan, rows, longest), settings=settings, runs_on=runs_on)


# --- shared ---------------------------------------------------------------------------------------


class _Reference:
    """Adds the reference forwards of DPO / KTO, whichever module TRL runs them on."""

    def __init__(self, plan: PlanBuilder, policy_outputs: Settings) -> None:
        self.plan = plan
        self.peft = plan.spec.peft is not None
        # What the policy's fused LM head returns, when the policy itself computes the reference.
        self.policy_outputs = policy_outputs

    def add(self, batches: list[int], lengths: list[int], *, training: bool) -> None:
        """The per-step reference forward, in the training loop or in evaluate()."""
        if self.peft:
            self._add_on_policy(batches, lengths, "policy_adapter_disabled", training)
        else:
            # The separate copy is loaded in eval mode and stays there; accelerate prepared it at init.
            self.plan.add_many(
                "ref", batches, lengths, settings={"reference": "ref_model", "training": False}
            )

    def add_precompute(self, batches: list[int], lengths: list[int]) -> None:
        """precompute_ref_log_probs: runs in the trainer's __init__, on the policy as loaded (eval mode)."""
        self._add_on_policy(batches, lengths, "policy_adapter_disabled" if self.peft else "policy", False)

    def _add_on_policy(self, batches: list[int], lengths: list[int], reference: str, training: bool) -> None:
        settings: Settings = {"reference": reference, "training": training, **self.policy_outputs}
        self.plan.add_many("ref", batches, lengths, settings=settings, runs_on="bare")


def _common_settings(plan: PlanBuilder) -> Settings:
    """Switches that change the policy's graphs in every preference trainer."""
    return {
        "use_liger_kernel": bool(plan.args.use_liger_kernel),
        "activation_offloading": bool(plan.args.activation_offloading),
    }


def _check_reference(plan: PlanBuilder) -> None:
    """The reference setups DPOTrainer / KTOTrainer refuse."""
    args = plan.args
    if args.sync_ref_model and plan.spec.peft:
        raise SpecError(
            "sync_ref_model does not work with PEFT (the reference is the policy with its adapter disabled)",
            loc="args.sync_ref_model",
        )
    if args.sync_ref_model and args.precompute_ref_log_probs:
        raise SpecError(
            "sync_ref_model and precompute_ref_log_probs exclude each other (precomputed log-probs would go stale)",
            loc="args.sync_ref_model",
        )


def _router_aux_loss(plan: PlanBuilder) -> bool:
    """Whether the policy's main forward asks for router logits (MoE load-balancing loss)."""
    config = plan.model.config.get("text_config") or plan.model.config
    coef = plan.args.router_aux_loss_coef
    if coef and "output_router_logits" not in config:
        raise SpecError(
            f"router_aux_loss_coef is {coef} but the model is not a Mixture-of-Experts model with router logits",
            loc="args.router_aux_loss_coef",
        )
    if coef is None:
        coef = config.get("router_aux_loss_coef", 0.0)
    return "output_router_logits" in config and coef != 0.0


def _warn_vision(plan: PlanBuilder) -> None:
    if "vision_config" in plan.model.config:
        plan.warn(
            "the model is vision-language: the plan covers text-only data; TRL 1.16's vision preference collators "
            "raise NotImplementedError when pad_to_multiple_of is set (so on Neuron with 'auto'), and image tokens "
            "make the row lengths data-dependent"
        )


def _longest_row(plan: PlanBuilder) -> int | None:
    """The longest row: max_length truncates (DPO, KTO) or filters (Reward) longer ones."""
    max_length: int | None = plan.args.max_length
    data_longest = plan.data.longest
    if max_length is None:
        if data_longest is None:
            plan.need(
                "args.max_length",
                "sequence lengths are unbounded: max_length is None and data.max_tokens is not given; "
                "set max_length, or give the data facts (--dataset PATH, or data.max_tokens)",
            )
        return data_longest
    return max_length if data_longest is None else min(max_length, data_longest)


def _lengths(plan: PlanBuilder, rows: int, longest: int) -> list[int]:
    """Padded lengths of a batch of `rows` rows: from its smallest possible longest row to `longest`."""
    return padded_lengths(min(smallest_batch_max(plan.data, rows), longest), longest, plan.multiple)


def _warn_prompts_dropped(plan: PlanBuilder) -> None:
    """DPO (keep_start) and KTO drop examples whose prompt alone fills max_length."""
    max_length = plan.args.max_length
    if max_length is None:
        return
    data = plan.data
    if data.min_prompt_tokens is not None and data.min_prompt_tokens >= max_length:
        raise SpecError(
            f"every prompt is at least max_length ({max_length}) tokens, and TRL drops such examples: "
            "raise max_length or check data.min_prompt_tokens",
            loc="args.max_length",
        )
    longest_prompt = data.max_prompt_tokens
    if longest_prompt is None and data.longest is not None:
        longest_prompt = data.longest - 1  # the completion is at least its EOS
    if longest_prompt is None or longest_prompt >= max_length:
        _warn_examples_dropped(
            plan, f"an example whose prompt alone is max_length ({max_length}) tokens or more"
        )


def _warn_examples_dropped(plan: PlanBuilder, what: str) -> None:
    data = plan.data
    if plan.world_size > 1 or (data.num_train_examples is None and data.num_eval_examples is None):
        return  # no short last batch depends on the example count
    plan.warn(
        f"TRL drops {what}, so the example counts, and with them the short last batches, can differ from "
        "data.num_train_examples / num_eval_examples; give data.max_prompt_tokens / max_tokens that rule drops "
        "out, or the counts after TRL's filtering"
    )


def _num_examples(plan: PlanBuilder, split: str) -> int | None:
    return plan.data.num_train_examples if split == "train" else plan.data.num_eval_examples


def _batch_sizes(
    plan: PlanBuilder, batch: int, split: str, *, drop_last: bool = False, precompute: bool = False
) -> list[int]:
    """Examples per batch of one pass over a split: full batches, and the short last one if any."""
    num_examples = _num_examples(plan, split)
    sizes = [batch] if full_batch_reachable(num_examples, batch, plan.world_size) else []
    remainder = partial_batch(num_examples, batch, drop_last=drop_last, world_size=plan.world_size)
    if remainder:
        sizes.append(remainder)
    elif num_examples is None and not drop_last and plan.world_size == 1:
        what = (
            f"reference-precompute batch over the {split} split"
            if precompute
            else f"{split} batch of each epoch"
        )
        fix = "" if precompute else " (or set dataloader_drop_last: true)"
        plan.warn(
            f"the last {what} is shorter than {batch} examples unless the example count divides evenly: give "
            f"data.num_{split}_examples{fix} to list it"
        )
    return sizes
