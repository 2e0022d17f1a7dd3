"""Real `trl <trainer> --config` files, as found in TRL's documentation and public recipes, through `warmup plan`.

tests/real_configs/ holds each file as its repository has it (PROVENANCE.yaml: repository, commit, path,
license, trainer; command lines written out as YAML say so), and the accelerate config files they name; the test
points `model_name_or_path` at a tiny model in a copy, nothing else, and runs where those accelerate files lie at
the paths the configs name them by (relative paths are read from the working directory, as `trl` reads them).
TRL 1.16's own CLI decides which files it accepts (tests/support/trl_cli_truth.py runs its parsers and
accelerate's launch checks); then:

- a file TRL accepts plans with exit 0 and at least one signature, or exits 2 naming the data fact its shapes
  need (the file has none): the prompt length of a trainer that generates, the longest example under
  `max_length: -1` (which does not bound the lengths); a QLoRA file exits 2 saying it compiles nothing to warm;
- a file TRL refuses exits 2, naming every field TRL refuses with a fix for it;
- a file without model_name_or_path (another tool's `model_id`) exits 2 naming it: TRL's CLI gets as far as
  the launch, but its script has no model to load;
- no file exits 0 with no signature.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.launch_truth import write_accelerate_configs
from tests.support.tiny_model import write_bpe_model
from tests.support.trl_cli_truth import trl_cli_verdict
from warmup.cli import main

ROOT = Path(__file__).resolve().parents[2] / "real_configs"
PROVENANCE = yaml.safe_load((ROOT / "PROVENANCE.yaml").read_text())
CONFIGS = PROVENANCE["configs"]
ACCELERATE_CONFIGS = PROVENANCE["accelerate_configs"]
ONLINE = {"grpo", "rloo", "distillation"}
# What a fix says: a replacement, a removal, a value, the missing fact, or TRL's own words for a value check.
FIX = re.compile(
    r"use `\w+` instead|drop it|did you mean|`trl` reads|set chat_template_path|--dataset PATH|packing_strategy: bfd"
    r"|TRL refuses it: .+|TRL's trainers read|a model setting|a warm-up key"
    r"|train without load_in_4bit|expected one of sft, dpo"  # QLoRA; a trainer `trl` does not have
)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    # Config and tokenizer only (planning reads no weights); max_position_embeddings 131072 holds every recipe.
    return write_bpe_model(tmp_path_factory.mktemp("real-config-model"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A working directory with every accelerate config file at the path the configs name it by."""
    return write_accelerate_configs(tmp_path_factory.mktemp("real-config-workdir"))


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def with_model(entry: dict, model: Path, tmp_path: Path) -> Path:
    data = yaml.safe_load((ROOT / entry["file"]).read_text())
    if "model_name_or_path" in data:
        data["model_name_or_path"] = str(model)
    copy = tmp_path / Path(entry["file"]).name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def test_the_collection_is_large_and_documented():
    assert len(CONFIGS) >= 140
    kinds = {entry.get("converted", "file") for entry in CONFIGS}
    assert kinds == {"file", "command line"}
    for entry in CONFIGS + ACCELERATE_CONFIGS:
        assert (ROOT / entry["file"]).is_file()
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and entry["repository"] and entry["license"]
    named = {entry["named"] for entry in ACCELERATE_CONFIGS}
    # every accelerate config file the collected configs name is in the collection (or is one of TRL's presets)
    for entry in CONFIGS:
        data = yaml.safe_load((ROOT / entry["file"]).read_text())
        assert data.get("config_file") in named | {None}, entry["file"]


@pytest.mark.parametrize("entry", CONFIGS, ids=[e["file"] for e in CONFIGS])
def test_a_real_config_plans_or_gets_trls_answer_with_the_fix(entry, model, workdir, tmp_path, monkeypatch):
    monkeypatch.chdir(workdir)
    accepted, trl_says = trl_cli_verdict(entry["trainer"], ROOT / entry["file"])
    if accepted and "model_name_or_path" not in yaml.safe_load((ROOT / entry["file"]).read_text()):
        accepted, trl_says = False, "no model_name_or_path: the script has no model to load"
    code, out, err = run(
        [
            "plan",
            str(with_model(entry, model, tmp_path)),
            "--trainer",
            entry["trainer"],
            "--target",
            "neuron",
            "--format",
            "json",
        ]
    )
    if code == 0:
        assert json.loads(out)["signatures"], "exit 0 with no signature: a CI pre-warm would warm nothing"
    if accepted:
        if code == 2 and "--dataset PATH" in err:  # the file has no data facts: the missing one is named
            assert (
                "data.max_prompt_tokens" in err
                if entry["trainer"] in ONLINE
                else "data.max_tokens" in err and "max_length -1" in err
            )
        elif code == 2 and "bitsandbytes quantization" in err:
            assert "train without load_in_4bit" in err  # QLoRA runs, but compiles nothing that can be warmed
        else:
            assert code == 0, err
        return
    assert code == 2, f"TRL refuses it ({trl_says}) but warmup plan exited {code}"
    problems = [line.strip() for line in err.splitlines()[1:]] or [
        err.removeprefix("error: invalid spec: ").strip()
    ]
    for problem in problems:
        assert FIX.search(problem), f"no fix in: {problem}"
    refused = re.search(r"unrecognized arguments: --(\w+)", trl_says)
    if refused:  # TRL names the first field it refuses; warmup names it too, with every other one
        assert f"args.{refused.group(1)}:" in err or f"{refused.group(1)}:" in err


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("max_seq_length", 1024, "use `max_length` instead"),
        ("torch_dtype", "bfloat16", "use `dtype` instead (a model setting"),
        ("warmup_ratio", 0.1, "use `warmup_steps` instead (a float works"),
        ("overwrite_output_dir", True, "removed after transformers v4.57.1: drop it"),
        ("evaluation_strategy", "steps", "use `eval_strategy` instead"),
        ("packing_strategy", "ffd", "packing_strategy: bfd"),
    ],
)
def test_fields_of_older_releases_get_the_exact_replacement(field, value, fix, model, tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), field: value}))
    code, _, err = run(["plan", str(config), "--trainer", "sft", "--target", "neuron"])
    assert code == 2 and f"args.{field}:" in err and fix in err


def test_grpo_max_prompt_length_points_at_the_prompt_fact(model, tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "max_prompt_length": 512}))
    code, _, err = run(["plan", str(config), "--trainer", "grpo", "--target", "neuron"])
    assert code == 2 and "args.max_prompt_length" in err and "--dataset PATH" in err


def test_orpo_is_not_taken_for_grpo(model, tmp_path):
    config = tmp_path / "orpo.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model)}))
    code, _, err = run(["plan", str(config), "--trainer", "orpo"])
    assert code == 2 and "did you mean" not in err and "trl.experimental" in err and "sft, dpo" in err


def test_smol_courses_max_length_minus_one_is_planned_as_trl_slices_it(model, tmp_path):
    """smol-course's `trl sft ... --max_length -1`: TRL truncates with [:-1], each example loses its last token."""
    data = yaml.safe_load((ROOT / "smol-course/units-en-unit3-4-L387.yaml").read_text())
    assert data["max_length"] == -1
    data.update(
        model_name_or_path=str(model), data={"max_tokens": 257, "min_tokens": 200, "num_train_examples": 32}
    )
    config = tmp_path / "smol.yaml"
    config.write_text(yaml.safe_dump(data))
    code, out, err = run(["plan", str(config), "--trainer", "sft", "--target", "neuron", "--format", "json"])
    assert code == 0, err
    plan = json.loads(out)
    assert {s["seq_len"] for s in plan["signatures"]} == {256}  # 257 - 1 tokens: one bucket of 128, not two
    assert (
        "max_length -1 does not turn truncation off: TRL slices every example with [:-1], dropping its last 1 "
        "token(s) (planned so); max_length: null is what turns it off, and is likely what was meant"
    ) in plan["warnings"]


def test_optimum_neurons_model_id_gets_trls_answer_not_the_spec_formats(tmp_path):
    code, out, err = run(
        [
            "plan",
            str(ROOT / "optimum-neuron/examples-training-qwen3-finetune_qwen3-L27.yaml"),
            "--trainer",
            "sft",
        ]
    )
    assert code == 2 and out == ""
    assert (
        "model_name_or_path: required: `trl` reads the model to train from model_name_or_path (TRL's ModelConfig); "
        "without it `trl sft` starts with no model to load"
    ) in err
    assert (
        "args.model_id: unknown field (`trl sft` refuses it: accelerate launch: unrecognized arguments: --model_id); "
        "optimum-neuron's training scripts' name for the model: `trl` reads model_name_or_path, rename it"
    ) in err
    for key in ("tensor_parallel_size", "zero_1", "async_save"):  # optimum-neuron's own arguments
        assert f"args.{key}: unknown field (`trl sft` refuses it" in err
    assert (
        "learning_rate" not in err and "model: Field required" not in err
    )  # TRL reads those; no spec format
