"""Rehearsal units: which run produces which signatures, and what compiles nothing."""

from __future__ import annotations

import pytest

from warmup.errors import RehearsalError
from warmup.rehearsal.units import plan_units
from warmup.signature import Signature


def sig(
    phase: str, batch: int, seq_len: int, *, trainer: str = "sft", cache_len: int | None = None, **kw
) -> Signature:
    return Signature(
        phase=phase,
        batch=batch,
        seq_len=seq_len,
        cache_len=cache_len,
        trainer=trainer,
        model="cafe",
        dtype="float32",
        compile=kw.pop("compile", "inductor"),
        settings=kw,
    )


def test_sft_train_signatures_are_one_unit_each():
    plan = plan_units(
        "sft", [sig("train", 2, 64), sig("train", 2, 32), sig("train", 1, 32)], pad_to_multiple_of=32
    )
    assert [(u.kind, u.batch, u.seq_len) for u in plan.units] == [
        ("train", 1, 32),
        ("train", 2, 32),
        ("train", 2, 64),
    ]
    assert [u.index for u in plan.units] == [0, 1, 2]
    assert plan.nothing_to_compile == {}


def test_dpo_reference_rides_with_the_training_step_of_its_shape():
    train, ref = sig("train", 4, 64, trainer="dpo"), sig("ref", 4, 64, trainer="dpo")
    eval_ref = sig("ref", 6, 64, trainer="dpo")  # the reference also runs over eval batches
    plan = plan_units("dpo", [train, ref, eval_ref], pad_to_multiple_of=None)
    assert len(plan.units) == 2
    step, evaluation = plan.units
    assert step.kind == "train" and step.keys == [train.key(), ref.key()]
    assert evaluation.kind == "eval" and evaluation.keys == [eval_ref.key()]


def test_on_inductor_the_planners_eager_passes_get_no_run(tiny_model_dir):
    """Generation, evaluation and GRPO old log-probs: the planner labels them eager; no unit runs them."""
    from warmup.job.spec import load_spec
    from warmup.planner.planning import plan_spec

    spec = load_spec(
        {
            "trainer": "grpo",
            "model": str(tiny_model_dir),
            "args": {
                "per_device_train_batch_size": 2,
                "num_generations": 2,
                "gradient_accumulation_steps": 2,
                "steps_per_generation": 4,
                "max_completion_length": 8,
                "pad_to_multiple_of": 16,
                "cache_implementation": "static",
                "torch_compile": True,
                "bf16": False,
                "eval_strategy": "steps",
                "per_device_eval_batch_size": 2,
            },
            "data": {"min_prompt_tokens": 10, "max_prompt_tokens": 20, "num_eval_examples": 4},
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    signatures = plan_spec(spec).signatures
    phases = {s.phase for s in signatures if s.compile == "eager"}
    assert {"old_logps", "eval", "generate_prefill", "generate_decode"} <= phases
    plan = plan_units("grpo", signatures, pad_to_multiple_of=16, max_completion_length=8)
    assert set(plan.nothing_to_compile) == {s.key() for s in signatures if s.compile == "eager"}
    assert {key for unit in plan.units for key in unit.keys} == {
        s.key() for s in signatures if s.compile != "eager"
    }
    assert all(s.phase == "train" for s in signatures if s.compile != "eager")


def test_the_planners_eager_label_is_respected_on_any_backend():
    eager = sig("train", 2, 32, compile="eager")
    for backend in ("neuron", "inductor"):
        plan = plan_units("sft", [eager], backend=backend, pad_to_multiple_of=128)
        assert plan.units == [] and eager.key() in plan.nothing_to_compile, backend


def test_on_neuron_generation_rides_with_the_step_that_uses_its_prompt_width():
    train32 = sig("train", 4, 32 + 16, trainer="grpo", compile="neuron")
    train16 = sig("train", 4, 16 + 16, trainer="grpo", compile="neuron")
    prefill = sig("generate_prefill", 4, 32, trainer="grpo", cache_len=39, compile="neuron")
    decode = sig("generate_decode", 4, 1, trainer="grpo", cache_len=39, compile="neuron")
    plan = plan_units(
        "grpo",
        [train32, train16, prefill, decode],
        backend="neuron",
        pad_to_multiple_of=16,
        max_completion_length=8,
        generation_rows={"train": 4, "eval": 2},
    )
    by_width = {u.seq_len: u for u in plan.units}
    assert prefill.key() in by_width[48].keys and by_width[48].cache_len == 39
    assert by_width[48].prompt_len == 32 and by_width[48].completion_len == 8
    assert decode.key() in by_width[32].keys + by_width[48].keys


def test_grpo_width_split_prefers_the_largest_completion_bucket():
    plan = plan_units(
        "grpo", [sig("train", 2, 40, trainer="grpo")], pad_to_multiple_of=None, max_completion_length=8
    )
    (unit,) = plan.units
    assert (unit.prompt_len, unit.completion_len) == (32, 8)
    given = sig("train", 2, 40, trainer="grpo", prompt_len=36)
    (unit,) = plan_units("grpo", [given], pad_to_multiple_of=None, max_completion_length=8).units
    assert (unit.prompt_len, unit.completion_len) == (36, 4)


def test_a_grpo_width_no_round_can_produce_is_refused():
    with pytest.raises(RehearsalError, match="cannot be split"):
        plan_units(
            "grpo", [sig("train", 2, 24, trainer="grpo")], pad_to_multiple_of=16, max_completion_length=8
        )


def test_unsupported_trainers_and_mixed_signatures_are_refused():
    with pytest.raises(RehearsalError, match="not written yet"):
        plan_units("orpo", [sig("train", 2, 32, trainer="orpo")], pad_to_multiple_of=None)
    with pytest.raises(RehearsalError, match="belongs to trainer"):
        plan_units("sft", [sig("train", 2, 32, trainer="dpo")], pad_to_multiple_of=None)
    with pytest.raises(RehearsalError, match="no step"):
        plan_units("sft", [sig("ref", 2, 32)], pad_to_multiple_of=None)


def test_a_generation_signature_without_a_step_is_refused_on_neuron():
    prefill = sig("generate_prefill", 4, 64, trainer="grpo", cache_len=71, compile="neuron")
    train = sig("train", 4, 32, trainer="grpo", compile="neuron")
    with pytest.raises(RehearsalError, match="generation signature"):
        plan_units("grpo", [train, prefill], backend="neuron", pad_to_multiple_of=16, max_completion_length=8)


def test_training_units_share_one_run_with_at_most_one_short_batch_last():
    from warmup.rehearsal.zygote import group_runs

    full64, full32 = sig("train", 4, 64), sig("train", 4, 32)
    short32, short64 = sig("train", 3, 32), sig("train", 2, 64)
    evaluation = sig("ref", 6, 32, trainer="dpo")
    units = plan_units("sft", [full64, full32, short32, short64], pad_to_multiple_of=32).units
    runs = group_runs(units, train_rows=4, grouping=True)
    group, *alone = runs
    assert [(u.batch, u.seq_len) for u in group] == [(4, 32), (4, 64), (3, 32)]
    assert [[(u.batch, u.seq_len) for u in run] for run in alone] == [[(2, 64)]]
    assert group_runs(units, train_rows=4, grouping=False) == [[u] for u in units]
    dpo = plan_units("dpo", [sig("train", 8, 32, trainer="dpo"), evaluation], pad_to_multiple_of=None).units
    assert group_runs(dpo, train_rows=8, grouping=True) == [[u] for u in dpo]  # one training unit: no group


def test_a_plan_that_compiles_nothing_needs_no_rehearsal_whatever_the_trainer():
    """Distillation under Inductor runs every pass eager: nothing to rehearse, so nothing is refused."""
    plan = plan_units(
        "distillation",
        [sig("train", 2, 32, trainer="distillation", compile="eager")],
        pad_to_multiple_of=None,
    )
    assert plan.units == [] and len(plan.nothing_to_compile) == 1
    for trainer in (
        "sft",
        "dpo",
        "kto",
        "reward",
        "grpo",
        "rloo",
        "orpo",
    ):  # orpo: its rehearsal is not written
        eager = plan_units(
            trainer, [sig("train", 2, 32, trainer=trainer, compile="eager")], pad_to_multiple_of=None
        )
        assert eager.units == [] and len(eager.nothing_to_compile) == 1, trainer


def test_kto_steps_pair_each_main_width_with_a_kl_width_and_carry_the_references():
    train = [sig("train", 2, w, trainer="kto") for w in (32, 64)]
    kl = [sig("old_logps", 2, w, trainer="kto") for w in (32, 64, 96)]
    refs = [sig("ref", 2, w, trainer="kto") for w in (32, 64, 96)]
    short = [sig("train", 1, 32, trainer="kto"), sig("ref", 1, 32, trainer="kto")]
    plan = plan_units("kto", train + kl + refs + short, pad_to_multiple_of=32, max_length=128)
    steps = {(u.batch, u.seq_len, u.kl_len): sorted(s.shape_label for s in u.signatures) for u in plan.units}
    # every signature in exactly one step; 96-wide KL rows need a main width of at least 52 (64)
    assert sorted(label for labels in steps.values() for label in labels) == sorted(
        s.shape_label for s in train + kl + refs + short
    )
    assert all(u.kind == "train" for u in plan.units)
    assert set(steps) == {(2, 32, 32), (2, 64, 64), (2, 64, 96), (1, 32, None)}
    assert steps[(2, 64, 96)] == ["old_logps 2x96", "ref 2x96"]  # train 2x64 and ref 2x64 ran already


def test_kto_kl_rows_too_wide_for_any_main_width_are_refused():
    with pytest.raises(RehearsalError, match="KL rows 128 wide"):
        plan_units(
            "kto",
            [sig("train", 2, 32, trainer="kto"), sig("old_logps", 2, 128, trainer="kto")],
            pad_to_multiple_of=32,
            max_length=128,
        )
