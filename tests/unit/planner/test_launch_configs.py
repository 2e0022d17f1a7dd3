"""A trl config's launch, planned as `accelerate launch` runs it (issue 29; issue 28's reading of sharded jobs).

Every case is a trl config carrying launch keys: `config_file:` pointing at each of TRL's
examples/accelerate_configs files (and its multi-node guide's, and gpt-oss-recipes' zero3), TRL's presets by
`accelerate_config:`, and explicit keys that override the file. The truth is accelerate's own code on the line TRL
builds (tests/support/launch_truth.py): the processes its launcher starts, the machines, the mode, the
environment it gives the training process and the DeepSpeedPlugin built from it. The plan's world size and the
Launch the planner read must equal it, and the plan's notes name the mode.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from tests.support.launch_truth import accelerate_truth, trl_launch_line, write_accelerate_configs
from tests.support.tiny_model import write_bpe_model
from warmup.cli import main
from warmup.errors import SpecError
from warmup.job.spec import load_spec
from warmup.job.trl_args import resolve_trainer_args

EXAMPLES = "examples/accelerate_configs"
DS_JSON = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {
        "stage": 3,
        "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "auto"},
    },
}
CASES = {
    "multi_gpu": {"config_file": f"{EXAMPLES}/multi_gpu.yaml"},
    "single_gpu": {"config_file": f"{EXAMPLES}/single_gpu.yaml"},
    "deepspeed_zero1": {"config_file": f"{EXAMPLES}/deepspeed_zero1.yaml"},
    "deepspeed_zero2": {"config_file": f"{EXAMPLES}/deepspeed_zero2.yaml"},
    "deepspeed_zero3": {"config_file": f"{EXAMPLES}/deepspeed_zero3.yaml"},
    "fsdp1": {"config_file": f"{EXAMPLES}/fsdp1.yaml"},
    "fsdp2": {"config_file": f"{EXAMPLES}/fsdp2.yaml"},
    "context_parallel": {"config_file": f"{EXAMPLES}/context_parallel_2gpu.yaml"},
    "alst_ulysses": {"config_file": f"{EXAMPLES}/alst_ulysses_4gpu.yaml"},
    "multi_node": {"config_file": "multi_node.yaml"},
    "multi_node_rank_1": {"config_file": "multi_node.yaml", "machine_rank": 1},
    # TRL's GRPO guide: 4 nodes of 8 under ZeRO-3, the count and the nodes given beside the file
    "zero3_on_4_machines": {
        "config_file": f"{EXAMPLES}/deepspeed_zero3.yaml",
        "num_processes": 32,
        "num_machines": 4,
        "machine_rank": 0,
        "main_process_ip": "10.0.0.1",
        "rdzv_backend": "c10d",
    },
    "zero3_stage_given": {"config_file": f"{EXAMPLES}/deepspeed_zero3.yaml", "zero_stage": 2},
    "zero3_offload_given": {
        "config_file": f"{EXAMPLES}/deepspeed_zero3.yaml",
        "offload_param_device": "cpu",
        "offload_optimizer_device": "cpu",
    },
    "zero2_two_processes": {"config_file": f"{EXAMPLES}/deepspeed_zero2.yaml", "num_processes": 2},
    "fsdp2_offload_given": {"config_file": f"{EXAMPLES}/fsdp2.yaml", "fsdp_offload_params": True},
    "fsdp1_made_2": {"config_file": f"{EXAMPLES}/fsdp1.yaml", "fsdp_version": 2},
    "precision_given": {"config_file": f"{EXAMPLES}/multi_gpu.yaml", "mixed_precision": "fp16"},
    "preset_zero3": {"accelerate_config": "zero3"},
    "preset_fsdp2": {"accelerate_config": "fsdp2"},
    "config_file_wins_over_preset": {
        "accelerate_config": "zero3",
        "config_file": f"{EXAMPLES}/multi_gpu.yaml",
    },
    "gpt_oss_zero3": {"config_file": "configs/zero3.yaml"},
    "deepspeed_json": {"config_file": "ds_file.yaml"},
    "dynamo_file": {"config_file": "dynamo.yaml"},
    "dynamo_given": {"config_file": f"{EXAMPLES}/multi_gpu.yaml", "dynamo_backend": "inductor"},
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    directory = write_accelerate_configs(tmp_path_factory.mktemp("launch-workdir"))
    write_bpe_model(directory / "model")
    (directory / "ds.json").write_text(json.dumps(DS_JSON))
    # an accelerate config of DeepSpeed that names a DeepSpeed JSON (accelerate's `deepspeed_config_file`)
    (directory / "ds_file.yaml").write_text(
        yaml.safe_dump(
            {
                "distributed_type": "DEEPSPEED",
                "num_processes": 4,
                "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero3_init_flag": True},
            }
        )
    )
    # accelerate's own dynamo section: every prepared module compiled
    (directory / "dynamo.yaml").write_text(
        yaml.safe_dump(
            {
                "distributed_type": "MULTI_GPU",
                "num_processes": 2,
                "dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"},
            }
        )
    )
    return directory


def write_config(directory: Path, name: str, keys: dict) -> Path:
    config = directory / f"trl-{name}.yaml"  # not an accelerate file's name (multi_node.yaml)
    config.write_text(
        yaml.safe_dump(
            {"model_name_or_path": "model", "bf16": False, "max_length": 64, **keys}, sort_keys=False
        )
    )
    return config


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_plan_runs_what_accelerate_launch_runs(case, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    config = write_config(workdir, case, CASES[case])
    truth = accelerate_truth(trl_launch_line("sft", config))

    launch = resolve_trainer_args(
        load_spec(str(config), trainer="sft", target={"backend": "inductor", "device": "cpu"})
    ).launch
    assert (launch.processes, launch.machines, launch.distributed_type) == (
        truth.processes,
        truth.machines,
        truth.distributed_type,
    )
    assert launch.mixed_precision == truth.mixed_precision
    if "ACCELERATE_DYNAMO_BACKEND" in truth.env:
        assert (launch.dynamo_backend or "no") == truth.env["ACCELERATE_DYNAMO_BACKEND"].lower()
        assert (launch.dynamo_mode or "default") == truth.env["ACCELERATE_DYNAMO_MODE"]
    if truth.deepspeed is not None:
        plugin = truth.deepspeed
        assert launch.zero_stage == plugin.zero_stage
        assert launch.offload_optimizer == (
            None if plugin.offload_optimizer_device == "none" else plugin.offload_optimizer_device
        )
        assert launch.offload_param == (
            None if plugin.offload_param_device == "none" else plugin.offload_param_device
        )
        assert launch.zero3_init == plugin.zero3_init_flag
        assert launch.deepspeed == {
            k: v for k, v in plugin.deepspeed_config.items() if k != "steps_per_print"
        }
    else:
        assert launch.zero_stage is None and not launch.deepspeed
    if truth.distributed_type == "FSDP":
        assert launch.fsdp_version == int(truth.env["FSDP_VERSION"])
        for key, value in launch.fsdp.items():
            variable = (
                "FSDP_TRANSFORMER_CLS_TO_WRAP"
                if key == "transformer_layer_cls_to_wrap"
                else f"FSDP_{key.upper()}"
            )
            assert str(value).lower() == truth.env[variable].lower(), key
        argv = trl_launch_line("sft", config)
        launched_file = argv[len(argv) - 1 - argv[::-1].index("--config_file") + 1]  # the last one wins
        given = {**yaml.safe_load(Path(launched_file).read_text()).get("fsdp_config", {})}
        given.update({k: v for k, v in CASES[case].items() if k.startswith("fsdp_")})
        assert {k.removeprefix("fsdp_") for k in given} - {"version"} <= set(launch.fsdp)
    else:
        assert launch.fsdp_version is None and not launch.fsdp

    # on GPUs, where these configs run (on CPU accelerate shards only with use_cpu: tests/integration/planner/
    # test_sharded_plans.py)
    code, out, err = run(["plan", str(config), "--trainer", "sft", "--target", "cuda", "--format", "json"])
    assert code == 0, err
    plan = json.loads(out)
    assert {s["world_size"] for s in plan["signatures"]} == {truth.processes}
    if launch.sharded:  # the notes name the mode and say how it is warmed
        assert any(note.startswith(launch.describe()) for note in plan["notes"]), plan["notes"]


def test_the_modes_are_named_precisely(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    named = {}
    for case in (
        "deepspeed_zero3",
        "zero3_offload_given",
        "fsdp1",
        "fsdp2_offload_given",
        "preset_zero3",
        "deepspeed_json",
    ):
        config = write_config(workdir, case, CASES[case])
        spec = load_spec(str(config), trainer="sft", target={"backend": "inductor", "device": "cpu"})
        named[case] = resolve_trainer_args(spec).launch.describe()
    assert named == {
        "deepspeed_zero3": f"DeepSpeed ZeRO-3, 8 processes from {EXAMPLES}/deepspeed_zero3.yaml",
        "zero3_offload_given": "DeepSpeed ZeRO-3 with CPU offload of the optimizer state and CPU offload of parameters, "
        f"8 processes from {EXAMPLES}/deepspeed_zero3.yaml",
        "fsdp1": f"FSDP1, 8 processes from {EXAMPLES}/fsdp1.yaml",
        "fsdp2_offload_given": f"FSDP2 with CPU offload of parameters, 8 processes from {EXAMPLES}/fsdp2.yaml",
        "preset_zero3": "DeepSpeed ZeRO-3, 8 processes from accelerate_config zero3",
        "deepspeed_json": "DeepSpeed ZeRO-3 with CPU offload of parameters, 4 processes from ds_file.yaml",
    }


@pytest.mark.parametrize(
    ("keys", "field", "path"),
    [
        (
            {"config_file": f"{EXAMPLES}/deepspeed_zero4.yaml"},
            "args.config_file",
            f"{EXAMPLES}/deepspeed_zero4.yaml",
        ),
        ({"accelerate_config": "zero3", "config_file": "nowhere.yaml"}, "args.config_file", "nowhere.yaml"),
        ({"deepspeed": "missing_ds.json", "num_processes": 2}, "args.deepspeed", "missing_ds.json"),
    ],
    ids=["config_file", "config_file_beside_a_preset", "trainer_deepspeed"],
)
def test_a_missing_file_exits_2_naming_it(keys, field, path, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    config = write_config(workdir, "missing", keys)
    code, out, err = run(["plan", str(config), "--trainer", "sft", "--target", "cpu"])
    assert code == 2 and out == ""
    assert (
        f"{field}: no such file: {path}" in err and str(workdir) in err
    )  # relative to the working directory


def test_a_deepspeed_json_with_the_keys_accelerate_refuses_beside_it_exits_2(workdir, monkeypatch):
    """DeepSpeedPlugin refuses accelerate's zero_stage (and the like) beside a deepspeed_config_file."""
    monkeypatch.chdir(workdir)
    accelerate_file = workdir / "ds_clash.yaml"
    accelerate_file.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "DEEPSPEED",
                "num_processes": 2,
                "deepspeed_config": {"deepspeed_config_file": "ds.json", "zero_stage": 2},
            }
        )
    )
    config = write_config(workdir, "clash", {"config_file": "ds_clash.yaml"})
    code, _, err = run(["plan", str(config), "--trainer", "sft", "--target", "cpu"])
    assert code == 2 and "args.config_file: accelerate refuses deepspeed_config keys zero_stage" in err


def test_the_trainers_deepspeed_and_fsdp_fields_are_read_as_transformers_maps_them(workdir, monkeypatch):
    from transformers import TrainingArguments

    monkeypatch.chdir(workdir)
    config = write_config(workdir, "trainer_deepspeed", {"deepspeed": "ds.json", "num_processes": 2})
    launch = resolve_trainer_args(
        load_spec(str(config), trainer="sft", target={"backend": "inductor", "device": "cpu"})
    ).launch
    assert (launch.distributed_type, launch.processes, launch.zero_stage, launch.offload_param) == (
        "DEEPSPEED",
        2,
        3,
        "cpu",
    )
    assert launch.deepspeed["zero_optimization"]["offload_param"] == {"device": "cpu"}

    fsdp = {
        "fsdp": "full_shard auto_wrap offload",
        "fsdp_config": {"transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "version": 1},
    }
    config = write_config(workdir, "trainer_fsdp", {**fsdp, "num_processes": 4})
    launch = resolve_trainer_args(
        load_spec(str(config), trainer="sft", target={"backend": "inductor", "device": "cpu"})
    ).launch
    truth = TrainingArguments(output_dir="x", use_cpu=True, **fsdp).fsdp_plugin_args
    assert (launch.distributed_type, launch.processes, launch.fsdp_version) == (
        "FSDP",
        4,
        truth["fsdp_version"],
    )
    assert launch.fsdp["offload_params"] is truth["cpu_offload"] is True
    assert launch.fsdp["transformer_layer_cls_to_wrap"] == truth["transformer_cls_names_to_wrap"]
    assert launch.fsdp["reshard_after_forward"] == truth["reshard_after_forward"]


def test_a_flag_that_takes_no_value_is_refused_with_the_way_that_works(workdir, monkeypatch):
    """`use_deepspeed: true` reaches accelerate as `--use_deepspeed True`: the True takes the script's place."""
    monkeypatch.chdir(workdir)
    config = write_config(workdir, "flag", {"use_deepspeed": True, "num_processes": 2})
    code, _, err = run(["plan", str(config), "--trainer", "sft", "--target", "cpu"])
    assert code == 2 and "args.use_deepspeed:" in err and "takes the training script's place" in err
    assert "config_file: FILE" in err


def test_num_processes_under_a_single_process_file_is_warned_about(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    config = write_config(
        workdir, "single", {"config_file": f"{EXAMPLES}/single_gpu.yaml", "num_processes": 8}
    )
    code, out, err = run(["plan", str(config), "--trainer", "sft", "--target", "cpu", "--format", "json"])
    assert code == 0, err
    plan = json.loads(out)
    assert {s["world_size"] for s in plan["signatures"]} == {1}
    assert any("num_processes 8 is not what runs" in warning for warning in plan["warnings"])


def test_the_launch_files_travel_with_the_spec_to_where_the_files_are_not(workdir, tmp_path, monkeypatch):
    """A service or a worker plans the spec the CLI read, away from the user's files: the accelerate config, the
    DeepSpeed JSON it names and the trainer's FSDP JSON come in the spec's `files`, and plan the same job."""
    from warmup.job.spec import parse_spec

    monkeypatch.chdir(workdir)
    (workdir / "fsdp.json").write_text(
        json.dumps({"version": 1, "transformer_layer_cls_to_wrap": "LlamaDecoderLayer"})
    )
    cases = {
        "deepspeed_json": CASES["deepspeed_json"],
        "zero3": CASES["zero3_offload_given"],
        "trainer_fsdp": {"fsdp": "full_shard", "fsdp_config": "fsdp.json", "num_processes": 4},
    }
    target = {"backend": "inductor", "device": "cpu"}
    for name, keys in cases.items():
        here = load_spec(str(write_config(workdir, name, keys)), trainer="sft", target=target)
        assert here.files  # read where the config is
        launch_here = resolve_trainer_args(here).launch
        document = json.loads(here.canonical_json())
        monkeypatch.chdir(tmp_path)  # the service: none of those files
        there = parse_spec(document)
        assert there.key() == here.key()
        launch_there = resolve_trainer_args(there).launch
        assert launch_there == launch_here and launch_there.deepspeed == launch_here.deepspeed
        monkeypatch.chdir(workdir)
    # a spec naming a file it does not carry, read where the file is not, is refused naming it
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as error:
        parse_spec({**document, "files": {}})
    assert "args.fsdp_config" in str(error.value) and "no such file: fsdp.json" in str(error.value)


def test_a_spec_without_launch_files_keeps_its_key():
    from warmup.job.spec import Spec

    spec = Spec(trainer="sft", model="m", args={"max_length": 64})
    assert '"files"' not in spec.canonical_json()
