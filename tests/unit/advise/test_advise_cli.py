"""`warmup advise`: the table, the bars and the recommendation; JSON that is the library's advice."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from tests.support.length_data import DISTRIBUTIONS
from warmup.advise.advice import advise, load_lengths
from warmup.cli import main
from warmup.job.spec import load_spec

LENGTHS = DISTRIBUTIONS["long_tailed"](random.Random(6), 300, 10, 900)


def write_job(tmp_path, model_dir, trainer: str = "sft", **args) -> tuple[str, str]:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "trainer": trainer,
                "model": str(model_dir),
                "args": {"per_device_train_batch_size": 8, "max_length": 1024, "bf16": False, **args},
                "target": {"backend": "neuron", "device": "neuron"},
            }
        )
    )
    dataset = tmp_path / "lengths.json"
    dataset.write_text(json.dumps({"train": LENGTHS}))
    return str(spec), str(dataset)


def test_json_is_the_librarys_advice(tiny_model_dir, tmp_path, capsys):
    spec, dataset = write_job(tmp_path, tiny_model_dir, num_train_epochs=3)
    assert main(["advise", spec, "--lengths", dataset, "--format", "json", "--max-truncated", "0.01"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = advise(load_spec(spec), load_lengths(dataset), max_truncated=0.01)
    assert printed == expected.model_dump(mode="json")
    option_keys = {"pad_to_multiple_of", "max_length", "signatures", "compile_seconds", "padded_tokens"}
    option_keys |= {"padding_waste", "projected_seconds", "examples_truncated"}
    assert all(option_keys <= option.keys() for option in printed["options"])


def test_table_bars_and_recommendation(tiny_model_dir, tmp_path, capsys):
    spec, dataset = write_job(tmp_path, tiny_model_dir, num_train_epochs=200)
    argv = ["advise", spec, "--lengths", dataset, "--multiples", "none,32,128,512", "--step-seconds", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    advice = advise(load_spec(spec), load_lengths(dataset), multiples=[None, 32, 128, 512], step_seconds=4.0)
    table = out.split("\n\n")[1].splitlines()
    assert len(table) == 1 + len(advice.options) == 1 + 4
    assert "current" in next(line for line in table if line.lstrip().startswith("128 "))
    best = advice.recommended
    assert "recommended" in next(
        line for line in table if line.lstrip().startswith(f"{best.pad_to_multiple_of} ")
    )
    assert "projected time (# compile, = training; > past the scale):" in out
    bars = [line for line in out.splitlines() if line.startswith("  pad ")]
    assert len(bars) == 4 and all(("#" in b or "=" in b) for b in bars)
    assert "pad none" in bars[-1] and bars[-1].split()[-3].endswith(">")  # hours of compiles: off the scale
    assert (
        not best.current and best.padding_waste < advice.current.padding_waste
    )  # many steps: less padding wins
    line = f"recommended: pad_to_multiple_of: {best.pad_to_multiple_of}, max_length: 1024:"
    assert line in out and "less than the current setting" in out
    assert "step time: calibrated: 4 s per optimizer step" in out


def test_errors_name_the_field(tiny_model_dir, tmp_path, capsys):
    spec, dataset = write_job(tmp_path, tiny_model_dir, trainer="dpo")
    assert main(["advise", spec, "--lengths", dataset]) == 2
    assert "dataset: the dpo trainer needs preference data" in capsys.readouterr().err
    assert main(["advise", spec]) == 2
    assert "--lengths" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"train": {"prompt": [3, 4], "completion": [5]}}))
    assert main(["advise", spec, "--lengths", str(broken)]) == 2
    assert "dataset.train: the columns differ in length" in capsys.readouterr().err


def test_dataset_is_read_with_the_facts_api(tiny_model_dir, tmp_path, capsys):
    """--dataset (or the config's own `dataset:`) tokenizes the dataset as the trainer does: the same advice as
    from the lengths the facts API reads."""
    from tests.support.tiny_model import words
    from warmup.advise.advice import lengths_from_facts
    from warmup.facts.reading import dataset_facts

    rng = random.Random(2)
    rows = DISTRIBUTIONS["bimodal"](rng, 120, 3, 400)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": words(n)}) + "\n" for n in rows))
    spec, _ = write_job(tmp_path, tiny_model_dir, max_length=256)
    assert main(["advise", spec, "--dataset", str(data), "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = advise(load_spec(spec), lengths_from_facts("sft", dataset_facts(load_spec(spec), data)))
    assert printed == expected.model_dump(mode="json")
    # TRL appends EOS to plain text: every row is one token longer than its words
    assert printed["current"]["real_tokens"] == sum(min(n + 1, 256) for n in rows)

    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump({**yaml.safe_load(Path(spec).read_text()), "dataset": str(data)}))
    assert main(["advise", str(named), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"] == printed["options"]
