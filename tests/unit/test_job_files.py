"""A trl config with its side file and flags: what the command line reads, and what it leaves to `trl`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from tests.support.tiny_model import words
from warmup.cli import main
from warmup.errors import SpecError
from warmup.job.spec import load_spec, parse_spec, read_job

NEURON = {"backend": "neuron", "device": "neuron"}


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def grpo_job(tiny_model_dir: Path, tmp_path: Path) -> dict[str, Path]:
    """A GRPO trl config `trl` runs as it is, a side file beside it, and a local dataset of prompts."""
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": words(n)}]}) + "\n" for n in (10, 150, 40))
    )
    config = tmp_path / "grpo.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": str(tiny_model_dir),
                "dataset_name": "trl-lib/DeepMath-103K",
                "reward_funcs": ["accuracy_reward"],
                "per_device_train_batch_size": 4,
                "num_generations": 4,
                "max_completion_length": 64,
                "num_processes": 2,
            }
        )
    )
    side = tmp_path / "grpo.warmup.yaml"
    side.write_text(
        yaml.safe_dump({"trainer": "grpo", "target": NEURON, "dataset": "prompts.jsonl", "pool": "trn2"})
    )
    return {"config": config, "side": side, "data": data}


def test_the_side_file_says_what_trl_must_not_see(grpo_job):
    job = read_job(grpo_job["config"], side=grpo_job["side"])
    assert job.spec.trainer == "grpo" and job.spec.target.backend == "neuron"
    assert job.spec.target.world_size == 2  # num_processes, the launcher's key
    assert job.dataset == str(grpo_job["data"])  # relative to the side file
    assert job.pool == "trn2"
    assert job.selection["dataset_name"] == "trl-lib/DeepMath-103K"
    assert "dataset_name" not in job.spec.args
    assert job.spec.args["num_processes"] == 2  # the launcher's keys stay in args as written


def test_a_side_file_holds_warm_up_keys_only(grpo_job, tmp_path):
    side = tmp_path / "bad.yaml"
    side.write_text("trainer: grpo\nlearning_rate: 1.0e-5\n")
    with pytest.raises(SpecError) as error:
        read_job(grpo_job["config"], side=side)
    assert [p.loc for p in error.value.problems] == ["side file.learning_rate"]


def test_plan_reads_the_prompt_facts_from_the_dataset(grpo_job):
    code, _, err = run(["plan", str(grpo_job["config"]), "--trainer", "grpo", "--target", "neuron"])
    assert code == 2 and "data.max_prompt_tokens" in err  # no facts: refused, naming the missing one
    code, out, _ = run(["plan", str(grpo_job["config"]), "--side", str(grpo_job["side"]), "--format", "json"])
    assert code == 0
    prompts = {s["seq_len"] for s in json.loads(out)["signatures"] if s["phase"] == "generate_prefill"}
    assert prompts == {128, 256}  # the prompts are 10 to 150 words, chat-templated: two buckets of 128


def test_facts_print_a_data_block_that_plans_the_same(grpo_job, tmp_path):
    code, out, _ = run(
        ["facts", str(grpo_job["config"]), "--trainer", "grpo", "--dataset", str(grpo_job["data"])]
    )
    assert code == 0
    data = yaml.safe_load(out)["data"]
    assert data["num_train_examples"] == 3 and data["max_prompt_tokens"] > 150
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text(yaml.safe_dump({"trainer": "grpo", "target": NEURON, "data": data}))
    by_dataset = read_job(grpo_job["config"], side=grpo_job["side"])
    by_paste = read_job(grpo_job["config"], side=pasted)
    assert by_paste.spec.data == by_paste.spec.data.model_validate(data)
    assert (
        by_dataset.spec.key() != by_paste.spec.key()
    )  # the dataset's facts are not computed by read_job ...
    code, out, _ = run(["plan", str(grpo_job["config"]), "--side", str(pasted), "--format", "json"])
    code2, out2, _ = run(
        ["plan", str(grpo_job["config"]), "--side", str(grpo_job["side"]), "--format", "json"]
    )
    assert (
        code == code2 == 0 and json.loads(out)["signatures"] == json.loads(out2)["signatures"]
    )  # ... the CLI's


def test_the_config_own_dataset_name_is_read_when_it_is_local(grpo_job, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "train.jsonl").write_text(grpo_job["data"].read_text())
    config = yaml.safe_load(grpo_job["config"].read_text())
    config["dataset_name"] = str(local)
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, _ = run(["facts", str(path), "--trainer", "grpo"])
    assert code == 0 and yaml.safe_load(out)["data"]["num_train_examples"] == 3
    code, _, err = run(["facts", str(grpo_job["config"]), "--trainer", "grpo"])  # a hub name not in the cache
    assert code == 2 and "nothing is downloaded: pass --dataset PATH" in err


def test_a_dataset_trl_cannot_load_is_refused_with_the_form_it_can(grpo_job, tmp_path):
    """`trl` loads dataset_name with load_dataset, which takes a folder, not a file: facts are read the same way."""
    config = yaml.safe_load(grpo_job["config"].read_text())

    def facts(extra_args: tuple[str, ...] = (), **selection: object) -> tuple[int, str, str]:
        path = tmp_path / "job.yaml"
        path.write_text(
            yaml.safe_dump({**{k: v for k, v in config.items() if k != "dataset_name"}, **selection})
        )
        return run(["facts", str(path), "--trainer", "grpo", *extra_args])

    file = str(grpo_job["data"])
    # read from dataset_name, or from --dataset while `trl` loads dataset_name
    for extra in ((), ("--dataset", file)):
        code, out, err = facts(extra, dataset_name=file)
        assert code == 2 and out == "", err
        assert (
            f"dataset_name: {file} is a file, which `trl` cannot load" in err and "find any data file" in err
        ), err
        assert "dataset_name: FOLDER" in err and "- path: json" in err and f"data_files: {file}" in err, err
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "prompts.jsonl").write_text(grpo_job["data"].read_text())
    mixture = [{"path": "json", "data_files": file}]
    for selection in ({"dataset_name": str(folder)}, {"datasets": mixture}):  # the forms the refusal names
        code, out, err = facts(**selection)
        assert code == 0 and yaml.safe_load(out)["data"]["num_train_examples"] == 3, err


def test_relative_data_paths_are_read_where_trl_runs_and_the_refusal_says_so(grpo_job, tmp_path, monkeypatch):
    """A config read from another directory than the one `trl` runs in: its relative data paths are looked for
    here, as `trl` would, and the refusal names this directory rather than advising a download."""
    import uuid

    config = yaml.safe_load(grpo_job["config"].read_text())
    job = tmp_path / "job"
    # A name no run has loaded before: offline, `load_dataset(NAME)` also finds a dataset cached under it.
    name = f"prompts-{uuid.uuid4().hex[:8]}"
    (job / name).mkdir(parents=True)
    (job / name / "prompts.jsonl").write_text(grpo_job["data"].read_text())
    mixture = job / "mixture.yaml"
    body = {k: v for k, v in config.items() if k != "dataset_name"}
    mixture.write_text(
        yaml.safe_dump({**body, "datasets": [{"path": "json", "data_files": f"{name}/prompts.jsonl"}]})
    )
    folder = job / "folder.yaml"
    folder.write_text(yaml.safe_dump({**body, "dataset_name": name}))
    monkeypatch.chdir(tmp_path)  # not the job's directory
    code, out, err = run(["facts", str(mixture), "--trainer", "grpo"])
    assert code == 2 and out == "", err
    assert (
        f"{name}/prompts.jsonl is relative, read from the directory `trl` runs in, as here ({tmp_path})"
        in err
    ), err
    assert "pass --dataset PATH" not in err, err
    code, out, err = run(["facts", str(folder), "--trainer", "grpo"])
    assert (
        code == 2 and f"a relative one is read from the directory `trl` runs in, as here: {tmp_path}" in err
    ), err
    monkeypatch.chdir(job)  # where `trl` runs: both forms load
    for path in (mixture, folder):
        code, out, err = run(["facts", path.name, "--trainer", "grpo"])
        assert code == 0 and yaml.safe_load(out)["data"]["num_train_examples"] == 3, err


def test_the_api_takes_facts_not_datasets(tiny_model_dir):
    with pytest.raises(SpecError) as error:
        parse_spec({"trainer": "sft", "model": str(tiny_model_dir), "dataset": "/data/x.jsonl"})
    assert error.value.problems[0].loc == "dataset" and "warmup facts" in str(error.value)
    with pytest.raises(SpecError, match="facts are not computed"):
        load_spec({"trainer": "sft", "model": str(tiny_model_dir), "dataset": "/data/x.jsonl"})


def test_a_world_size_that_contradicts_the_launcher_is_refused(grpo_job):
    with pytest.raises(SpecError) as error:
        read_job(grpo_job["config"], side=grpo_job["side"], target={"world_size": 8})
    assert error.value.problems[0].loc == "target.world_size"


def test_relative_paths_are_resolved_where_the_config_is_read(tiny_model_dir, tmp_path, monkeypatch):
    """As `trl` resolves them, from its working directory: the spec leaves the client with absolute paths, so a
    service running elsewhere reads the same model; what no directory holds stays as written and its reader says
    where it looked."""
    import shutil
    import socket

    from warmup.errors import ModelConfigError
    from warmup.job.model_facts import read_model_facts

    job = tmp_path / "job"
    shutil.copytree(tiny_model_dir, job / "tiny-qwen")
    (job / "template.jinja").write_text("{{ messages }}")
    (job / "job.yaml").write_text(
        "model_name_or_path: ./tiny-qwen\nchat_template_path: template.jinja\noutput_dir: out\n"
    )
    monkeypatch.chdir(job)
    spec = read_job("job.yaml", trainer="sft").spec
    assert spec.model == str(job / "tiny-qwen")
    assert spec.args["chat_template_path"] == str(job / "template.jinja")
    assert spec.args["output_dir"] == "out"  # what `trl` writes, not reads, stays as written
    assert parse_spec({"trainer": "sft", "model": "Qwen/Qwen3-0.6B"}).model == "Qwen/Qwen3-0.6B"  # a Hub id
    elsewhere = tmp_path / "service"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the service's working directory
    assert read_model_facts(spec.model).config_hash == read_model_facts(str(tiny_model_dir)).config_hash
    with pytest.raises(ModelConfigError) as error:
        read_model_facts("./tiny-qwen")
    assert f"looked on {socket.gethostname()} at {elsewhere / 'tiny-qwen'}" in str(error.value)
