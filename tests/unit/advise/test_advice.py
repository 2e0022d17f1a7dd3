"""What `warmup advise` compares: every option's signatures are what `warmup plan` lists for that setting, the
recommendation is the fastest option, and the trade-off moves the way compile and step costs say.

Generated datasets (uniform, bimodal, long-tailed lengths) for SFT, DPO and GRPO. The data facts each option
is planned with are computed here from the lengths, apart from the advisor: the rows TRL keeps under the
option (DPO drops the examples whose prompt fills max_length; GRPO's prompt filter drops longer prompts).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import zlib
from collections import Counter

import numpy as np
import pytest
import yaml

from tests.support.length_data import DISTRIBUTIONS
from warmup.advise.advice import DatasetLengths, SplitLengths, advise
from warmup.cli import main
from warmup.job.spec import load_spec
from warmup.planner.estimate import CompileCosts, estimate_seconds

BASE_ARGS = {
    "sft": {"per_device_train_batch_size": 4, "max_length": 300},
    "dpo": {"per_device_train_batch_size": 2, "max_length": 300},
    "grpo": {
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 64,
        "cache_implementation": "static",
    },
}


def dataset(trainer: str, distribution: str, n: int = 120) -> DatasetLengths:
    rng = random.Random(zlib.crc32(f"{trainer}/{distribution}".encode()))  # str hash() differs per process
    lengths = DISTRIBUTIONS[distribution](rng, n, 8, 400)
    if trainer == "sft":
        return DatasetLengths(train=SplitLengths.of(completion=lengths), source=distribution)
    if trainer == "dpo":
        prompts = [max(1, n // 3) for n in lengths]
        return DatasetLengths(
            train=SplitLengths.of(
                prompt=prompts,
                completion=[n - p for n, p in zip(lengths, prompts, strict=True)],
                rejected=[rng.randint(1, 200) for _ in lengths],
            ),
            source=distribution,
        )
    return DatasetLengths(train=SplitLengths.of(prompt=lengths), source=distribution)


def spec_document(trainer: str, model_dir, args: dict, data: dict | None = None) -> dict:
    document = {
        "trainer": trainer,
        "model": str(model_dir),
        "args": {**args, "bf16": False},
        "target": {"backend": "neuron", "device": "neuron"},
    }
    if data is not None:
        document["data"] = data
    return document


def facts_kept(trainer: str, lengths: SplitLengths, option) -> dict:
    """The data facts of the examples TRL keeps under the option, rows before truncation."""
    prompt, completion, rejected = lengths.prompt, lengths.completion, lengths.rejected
    if trainer == "grpo":
        kept = prompt if option.max_prompt_length is None else prompt[prompt <= option.max_prompt_length]
        return {
            "num_train_examples": len(kept),
            "max_prompt_tokens": int(kept.max()),
            "min_prompt_tokens": int(kept.min()),
        }
    if trainer == "dpo":
        keep = prompt < option.max_length
        rows = np.concatenate([(prompt + completion)[keep], (prompt + rejected)[keep]])
        prompts = {"max_prompt_tokens": int(prompt[keep].max()), "min_prompt_tokens": int(prompt[keep].min())}
    else:
        keep = np.ones(len(prompt), bool)
        rows, prompts = completion, {}
    return {
        "num_train_examples": int(keep.sum()),
        "length_histogram": {int(k): v for k, v in sorted(Counter(rows.tolist()).items())},
        "max_tokens": int(rows.max()),
        "min_tokens": int(rows.min()),
        **prompts,
    }


def warmup_plan(tmp_path, document: dict) -> list[dict]:
    path = tmp_path / "option.yaml"
    path.write_text(yaml.safe_dump(document))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", str(path), "--format", "json"]) == 0
    return json.loads(out.getvalue())["signatures"]


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("trainer", ["sft", "dpo", "grpo"])
def test_every_option_lists_what_warmup_plan_lists(tiny_model_dir, tmp_path, trainer, distribution):
    lengths = dataset(trainer, distribution)
    spec = load_spec(spec_document(trainer, tiny_model_dir, BASE_ARGS[trainer]))
    advice = advise(spec, lengths, max_truncated=0.05)

    assert len(advice.options) >= 6 and sum(o.current for o in advice.options) == 1
    assert any(o.examples_truncated or o.examples_dropped for o in advice.options), "no truncation option"
    for option in advice.options:
        args = {**BASE_ARGS[trainer], **option.args}
        document = spec_document(trainer, tiny_model_dir, args, facts_kept(trainer, lengths.train, option))
        listed = warmup_plan(tmp_path, document)
        assert [s.model_dump(mode="json") for s in option.signatures] == listed, option.args


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("trainer", ["sft", "dpo", "grpo"])
def test_recommendation_is_the_least_projected_time(tiny_model_dir, trainer, distribution):
    lengths = dataset(trainer, distribution)
    spec = load_spec(spec_document(trainer, tiny_model_dir, BASE_ARGS[trainer]))
    advice = advise(spec, lengths, max_truncated=0.02, step_seconds=0.5)

    fastest = min(o.projected_seconds for o in advice.options)
    assert advice.recommended.projected_seconds == fastest
    assert advice.saving_seconds == pytest.approx(advice.current.projected_seconds - fastest)
    for option in advice.options:
        assert option.compile_seconds == pytest.approx(
            sum(estimate_seconds(s, "neuron") for s in option.signatures)
        )
        assert option.projected_seconds == pytest.approx(option.compile_seconds + option.train_seconds)
    # Calibrated on the current setting: its steps take the measured time each.
    assert advice.current.train_seconds == pytest.approx(0.5 * advice.current.steps)


def test_compile_or_steps_decide_the_padding(tiny_model_dir):
    """Few steps: compiles dominate and the coarsest padding (fewest shapes) wins. Many slow steps: padding
    waste dominates and a finer multiple wins, at the cost of more shapes."""
    lengths = dataset("sft", "uniform", n=400)
    short = load_spec(spec_document("sft", tiny_model_dir, {**BASE_ARGS["sft"], "max_steps": 5}))
    long = load_spec(spec_document("sft", tiny_model_dir, {**BASE_ARGS["sft"], "num_train_epochs": 50}))

    few = advise(short, lengths, step_seconds=1.0)
    many = advise(long, lengths, step_seconds=20.0)
    assert len(few.recommended.signatures) == min(len(o.signatures) for o in few.options)
    assert many.recommended.padding_waste < few.recommended.padding_waste
    assert len(many.recommended.signatures) > len(few.recommended.signatures)
    assert many.recommended.pad_to_multiple_of is not None and many.recommended.pad_to_multiple_of < 128


def test_recorded_compile_seconds_replace_the_seeds(tiny_model_dir):
    lengths = dataset("sft", "bimodal")
    spec = load_spec(spec_document("sft", tiny_model_dir, BASE_ARGS["sft"]))
    seeded = advise(spec, lengths)
    first = seeded.current.signatures[0]
    seen: list = []

    def recorded(signatures):
        seen.extend(signatures)
        return CompileCosts("neuron", {first.key(): 5.0}, {(first.model, "train"): 30.0})

    advice = advise(spec, lengths, compile_costs=recorded)
    assert {s.key() for o in advice.options for s in o.signatures} == {s.key() for s in seen}
    trains = [s for s in advice.current.signatures if s.phase == "train"]
    assert advice.current.compile_seconds == 5.0 + 30.0 * (len(trains) - 1) + sum(
        estimate_seconds(s, "neuron") for s in advice.current.signatures if s.phase != "train"
    )
    assert "recorded under this toolchain" in advice.compile_costs


def test_refusals_name_the_field(tiny_model_dir):
    from warmup.errors import SpecError

    lengths = dataset("sft", "uniform")
    packed = load_spec(spec_document("sft", tiny_model_dir, {**BASE_ARGS["sft"], "packing": True}))
    with pytest.raises(SpecError, match="packing"):
        advise(packed, lengths)
    kto = load_spec(spec_document("kto", tiny_model_dir, {"per_device_train_batch_size": 2}))
    with pytest.raises(SpecError, match="trainer"):
        advise(kto, lengths)
    dpo = load_spec(spec_document("dpo", tiny_model_dir, BASE_ARGS["dpo"]))
    with pytest.raises(SpecError, match="rejected"):
        advise(dpo, lengths)
    sft = load_spec(spec_document("sft", tiny_model_dir, BASE_ARGS["sft"]))
    with pytest.raises(SpecError, match="multiples: a padding multiple must be in"):
        advise(sft, lengths, multiples=[64, 1 << 40])
    huge = spec_document("sft", tiny_model_dir, {**BASE_ARGS["sft"], "per_device_train_batch_size": 4096})
    huge["target"]["world_size"] = 4096
    with pytest.raises(SpecError, match=r"per_device_train_batch_size: .* rows a step"):
        advise(load_spec(huge), lengths)
