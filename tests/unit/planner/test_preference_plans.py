"""DPO / KTO / Reward plans without running a trainer: warnings, refused configs, world size, targets.

The model is only a config.json here (the planner reads nothing else), so MoE and vision-language
configs are a few keys away.
"""

from __future__ import annotations

import json

import pytest

from warmup.cli import main
from warmup.errors import EmptyPlanError, SpecError
from warmup.job.spec import load_spec
from warmup.planner.planning import estimate_seconds, plan_spec
from warmup.signature import Plan

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 207,
}
CPU = {"backend": "inductor", "device": "cpu"}
NEURON = {"backend": "neuron", "device": "neuron"}
COMPILED = {"torch_compile": True}


@pytest.fixture
def model(tmp_path):
    def write(**extra) -> str:
        directory = tmp_path / f"model-{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({**QWEN3, **extra}))
        return str(directory)

    return write


def make_plan(
    trainer: str, model_dir: str, args: dict, data: dict | None = None, *, target=None, peft=None
) -> Plan:
    spec = {
        "trainer": trainer,
        "model": model_dir,
        "args": {"pad_to_multiple_of": 16, **args},
        "data": data or {},
        "target": target or CPU,
    }
    if peft is not None:
        spec["peft"] = peft
    return plan_spec(load_spec(spec))


def shapes(plan: Plan, phase: str | None = None) -> set[tuple[str, int, int]]:
    return {(s.phase, s.batch, s.seq_len) for s in plan.signatures if phase in (None, s.phase)}


def phases(plan: Plan) -> set[str]:
    return {s.phase for s in plan.signatures}


def warned(plan: Plan, text: str) -> bool:
    return any(text in warning for warning in plan.warnings)


FACTS = {"num_train_examples": 10, "num_eval_examples": 5, "min_tokens": 5, "max_tokens": 30}
EVAL = {"eval_strategy": "epoch", "per_device_train_batch_size": 4, "per_device_eval_batch_size": 2}


# --- DPO ------------------------------------------------------------------------------------------


def test_dpo_rows_are_chosen_plus_rejected_with_a_reference_pass_per_shape(model):
    plan = make_plan("dpo", model(), {**EVAL, "max_length": 64}, FACTS)
    lengths = [16, 32]
    train = {("train", rows, n) for rows in (8, 4) for n in lengths}  # 10 % 4 = 2 pairs in the last batch
    evals = {("eval", rows, n) for rows in (4, 2) for n in lengths}  # 5 % 2 = 1 pair
    assert shapes(plan, "train") == train
    assert shapes(plan, "eval") == evals
    assert shapes(plan, "ref") == {("ref", b, n) for _, b, n in train | evals}
    policy = next(s for s in plan.signatures if s.phase == "train")
    reference = next(s for s in plan.signatures if s.phase == "ref")
    assert reference.model == policy.model  # the reference is a copy of the policy
    assert reference.settings == {"reference": "ref_model", "training": False}
    assert policy.gradient_checkpointing and not reference.gradient_checkpointing
    assert policy.settings["loss_type"] == "sigmoid"


def test_dpo_several_processes_have_no_short_last_batch(model):
    args = {**EVAL, "max_length": 64, "precompute_ref_log_probs": True, "precompute_ref_batch_size": 3}
    single = make_plan("dpo", model(), args, FACTS, target=NEURON)
    multi = make_plan("dpo", model(), args, FACTS, target={**NEURON, "world_size": 2})
    # precompute batches of 3 pairs, and the 10 % 3 and 5 % 3 pairs left over
    assert {s.batch for s in single.signatures if s.phase == "ref"} == {6, 2, 4}
    assert {s.batch for s in multi.signatures} == {8, 6, 4}  # train, precompute, eval: full batches only
    assert all(s.world_size == 2 for s in multi.signatures)


def test_dpo_precompute_runs_on_the_policy_and_not_per_step(model):
    args = {**EVAL, "max_length": 64, "precompute_ref_log_probs": True}
    plan = make_plan("dpo", model(), args, FACTS, target=NEURON)
    references = [s for s in plan.signatures if s.phase == "ref"]
    assert {s.batch for s in references} == {8, 4, 2}  # train batch 4 (and 2 left), eval batch 2 (and 1)
    assert {s.settings["reference"] for s in references} == {"policy"}
    assert not any(s.settings["training"] for s in references)  # run in __init__, on the policy as loaded


def test_dpo_on_neuron_pads_to_128_by_default(model):
    spec = load_spec(
        {"trainer": "dpo", "model": model(), "args": {"max_length": 1000}, "data": FACTS, "target": NEURON}
    )
    plan = plan_spec(spec)
    assert {s.seq_len for s in plan.signatures} == {128}  # rows of at most 30 tokens
    spec = load_spec({"trainer": "dpo", "model": model(), "args": {"max_length": 1000}, "target": NEURON})
    assert {s.seq_len for s in plan_spec(spec).signatures} == set(range(128, 1025, 128))  # ceil_128(1000)


@pytest.mark.parametrize(
    ("trainer", "args", "peft", "compiled"),
    [
        ("dpo", {}, None, {"train", "ref"}),  # the separate reference copy is compiled, in eval too
        ("dpo", {"precompute_ref_log_probs": True}, None, {"train"}),
        ("dpo", {}, {"lora_r": 8}, {"train"}),  # the PEFT reference is the bare policy
        ("kto", {}, None, {"train", "old_logps", "ref"}),  # the KL forward goes through the wrapped policy
        ("kto", {"precompute_ref_log_probs": True}, None, {"train", "old_logps"}),
        ("reward", {}, None, {"train"}),
    ],
)
def test_inductor_lists_bare_policy_passes_as_eager(model, trainer, args, peft, compiled):
    """torch.compile wraps the policy when training starts; precompute, the PEFT reference and the
    evaluation loop call it bare, so they run eagerly: listed all the same, labelled eager."""
    job = {**EVAL, "max_length": 64, **args}
    on = make_plan(trainer, model(), {**job, **COMPILED}, FACTS, peft=peft)
    off = make_plan(trainer, model(), job, FACTS, peft=peft)
    neuron = make_plan(trainer, model(), {**job, **COMPILED}, FACTS, peft=peft, target=NEURON)
    assert shapes(on) == shapes(off) == shapes(neuron)  # every shape the job hits, whatever compiles
    assert phases(on) == {"dpo": {"train", "ref", "eval"}, "kto": {"train", "old_logps", "ref", "eval"}}.get(
        trainer, {"train", "eval"}
    )
    assert {s.phase for s in on.signatures if s.compile != "eager"} == compiled
    assert {s.compile for s in on.signatures} == {"inductor", "eager"}
    assert {s.compile for s in off.signatures} == {"eager"}
    assert {s.compile for s in neuron.signatures} == {"neuron"}  # TorchNeuron compiles eager ops too
    assert all(estimate_seconds(s, "inductor") == 0 for s in on.signatures if s.compile == "eager")


def test_dpo_peft_reference_is_the_policy_with_its_adapter_disabled(model):
    peft = {"lora_r": 8, "lora_alpha": 16}
    plan = make_plan("dpo", model(), {**EVAL, "max_length": 64}, FACTS, peft=peft, target=NEURON)
    references = [s for s in plan.signatures if s.phase == "ref"]
    assert {s.settings["reference"] for s in references} == {"policy_adapter_disabled"}
    # In the training loop the policy is in train mode, in evaluate() in eval mode: two graphs each.
    assert {(s.batch, s.settings["training"]) for s in references} == {
        (8, True),
        (4, True),
        (4, False),
        (2, False),
    }
    assert all(s.frozen is not None for s in plan.signatures)


@pytest.mark.parametrize(
    ("args", "loc"),
    [
        ({"sync_ref_model": True, "precompute_ref_log_probs": True}, "args.sync_ref_model"),
        ({"loss_type": ["exo_pair"]}, "args.label_smoothing"),
        ({"loss_type": ["aot"], "use_weighting": True}, "args.use_weighting"),
        ({"loss_type": ["bco_pair"], "f_divergence_type": "js_divergence"}, "args.f_divergence_type"),
        ({"router_aux_loss_coef": 0.01}, "args.router_aux_loss_coef"),
    ],
)
def test_dpo_refuses_what_dpo_trainer_refuses(model, args, loc):
    with pytest.raises(SpecError) as error:
        make_plan("dpo", model(), args)
    assert error.value.problems[0].loc == loc


def test_dpo_sync_ref_model_is_refused_with_peft(model):
    with pytest.raises(SpecError, match="PEFT"):
        make_plan("dpo", model(), {"sync_ref_model": True}, peft={"lora_r": 8})


def test_dpo_padding_free_is_ignored_with_a_warning(model):
    plan = make_plan("dpo", model(), {"padding_free": True, "max_length": 64}, FACTS)
    assert warned(plan, "padding_free is ignored")
    assert {s.batch for s in plan.signatures if s.phase == "train"} == {
        16,
        4,
    }  # padded rows, not one packed row


def test_dpo_warns_when_examples_may_be_dropped(model):
    long_rows = {**FACTS, "max_tokens": 100}
    assert warned(make_plan("dpo", model(), {"max_length": 64}, long_rows), "prompt alone")
    short_prompts = {**long_rows, "max_prompt_tokens": 40}
    assert not warned(make_plan("dpo", model(), {"max_length": 64}, short_prompts), "prompt alone")
    assert not warned(
        make_plan("dpo", model(), {"max_length": 64, "truncation_mode": "keep_end"}, long_rows), "drops"
    )
    with pytest.raises(SpecError, match="every prompt"):
        make_plan(
            "dpo",
            model(),
            {"max_length": 64},
            {**long_rows, "min_prompt_tokens": 64, "max_prompt_tokens": 80},
        )


def test_unknown_example_counts_and_lengths_are_warned(model):
    plan = make_plan("dpo", model(), {"max_length": 64, "precompute_ref_log_probs": True}, target=NEURON)
    assert warned(plan, "give data.num_train_examples (or set dataloader_drop_last: true)")
    assert warned(plan, "reference-precompute batch over the train split")
    with pytest.raises(EmptyPlanError) as unbounded:
        make_plan("dpo", model(), {"max_length": None})
    assert [p.loc for p in unbounded.value.problems] == ["args.max_length"]


def test_vision_language_models_are_planned_for_text_only(model):
    plan = make_plan("dpo", model(vision_config={"hidden_size": 32}), {"max_length": 64}, FACTS)
    assert warned(plan, "vision-language")


def test_moe_router_logits_go_with_the_main_forward_only(model):
    moe = model(output_router_logits=False, router_aux_loss_coef=0.001)
    plan = make_plan("kto", moe, {**EVAL, "max_length": 64}, FACTS)
    by_phase = {}
    for s in plan.signatures:
        by_phase.setdefault(s.phase, set()).add(s.settings.get("output_router_logits"))
    assert by_phase["train"] == {True}
    assert by_phase["old_logps"] == {False}  # the KL forward does not ask for router logits
    assert by_phase["eval"] == {True, False}  # eval main and KL rows: two graphs per shape
    no_aux = make_plan("kto", moe, {**EVAL, "max_length": 64, "router_aux_loss_coef": 0.0}, FACTS)
    assert all(s.settings.get("output_router_logits") in (False, None) for s in no_aux.signatures)


def test_many_buckets_under_torch_compile_warn_about_the_recompile_limit(model):
    plan = make_plan("dpo", model(), {**COMPILED, "max_length": 256}, {**FACTS, "max_tokens": 256})
    assert warned(plan, "recompile_limit")


# --- KTO ------------------------------------------------------------------------------------------


def test_kto_kl_needs_the_sequential_sampler_and_two_examples(model):
    with pytest.raises(SpecError) as error:
        make_plan("kto", model(), {"train_sampling_strategy": "random"})
    assert error.value.problems[0].loc == "args.train_sampling_strategy"
    with pytest.raises(SpecError) as error:
        make_plan("kto", model(), {"per_device_train_batch_size": 1})
    assert error.value.problems[0].loc == "args.per_device_train_batch_size"
    plan = make_plan(
        "kto",
        model(),
        {
            "loss_type": "apo_zero_unpaired",
            "train_sampling_strategy": "random",
            "per_device_train_batch_size": 1,
        },
        FACTS,
    )
    assert not shapes(plan, "old_logps")


def test_kto_kl_rows_use_the_prompt_facts(model):
    args = {**EVAL, "max_length": 128}
    wide = make_plan("kto", model(), args, FACTS)
    # A 29-token prompt joined to a 30-token completion: KL rows up to 59 tokens, padded to 64.
    assert max(n for _, _, n in shapes(wide, "old_logps")) == 64
    assert warned(wide, "max_prompt_tokens")
    narrow = make_plan("kto", model(), args, {**FACTS, "min_prompt_tokens": 10, "max_prompt_tokens": 12})
    # prompts 10..12, completions 1..20: KL rows 11..32
    assert shapes(narrow, "old_logps") == {("old_logps", b, n) for b in (4, 2) for n in (16, 32)}
    assert not warned(narrow, "max_prompt_tokens")


def test_kto_one_example_alone_in_its_kl_group_keeps_its_own_completion(model):
    args = {**EVAL, "max_length": 128}
    facts = {**FACTS, "num_train_examples": 9, "min_prompt_tokens": 1, "max_prompt_tokens": 25}
    plan = make_plan("kto", model(), args, facts)
    # 9 % 4 = 1: the last batch's KL row is its own row (5..30 tokens); full batches reach 25 + 29.
    assert shapes(plan, "old_logps") == {("old_logps", 1, n) for n in (16, 32)} | {
        ("old_logps", 4, n) for n in (16, 32, 48, 64)
    }
    # Several map processes restart the rotation groups at each shard: no such guarantee.
    sharded = make_plan("kto", model(), {**args, "dataset_num_proc": 2}, facts)
    assert ("old_logps", 1, 64) in shapes(sharded)


# --- Reward ---------------------------------------------------------------------------------------


def test_reward_rows_and_filtering(model):
    plan = make_plan("reward", model(), {**EVAL, "max_length": 40}, {**FACTS, "max_tokens": 60})
    assert shapes(plan) == {
        (p, b, n) for p, bs in (("train", (8, 4)), ("eval", (4, 2))) for b in bs for n in (16, 32, 48)
    }
    assert warned(plan, "longer than max_length")
    with pytest.raises(SpecError, match="every row is longer"):
        make_plan("reward", model(), {"max_length": 40}, {"min_tokens": 41, "max_tokens": 60})


def test_reward_world_size_and_drop_last(model):
    args = {**EVAL, "max_length": 64, "dataloader_drop_last": True}
    assert {s.batch for s in make_plan("reward", model(), args, FACTS).signatures} == {8, 4}
    multi = make_plan("reward", model(), {**EVAL, "max_length": 64}, FACTS, target={**CPU, "world_size": 4})
    assert {s.batch for s in multi.signatures} == {8, 4}
    assert not warned(multi, "drops")


# --- CLI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer", ["dpo", "kto", "reward"])
def test_warmup_plan_prints_table_and_json(model, tmp_path, capsys, trainer):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"trainer: {trainer}\nmodel: {model()}\nargs:\n  per_device_train_batch_size: 4\n  max_length: 256\n"
        "data:\n  num_train_examples: 10\n  max_tokens: 200\n"
    )
    assert main(["plan", str(spec)]) == 0
    table = capsys.readouterr().out
    assert "train" in table and "signature(s)" in table
    assert main(["plan", str(spec), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {s["trainer"] for s in document["signatures"]} == {trainer}
    assert {s["seq_len"] for s in document["signatures"]} == {128, 256}  # 'auto' on Neuron: 128
