"""`warmup plan` on sharded launches: TRL's documented `accelerate_config` presets and alignment-handbook's ZeRO-3
recipes. Each plans with exit 0 and signatures that carry the sharding wrapper, or exits 2 naming why the mode cannot
be warmed on that target and the mode that works; never exit 0 without signatures (docs/multi-node.md)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.tiny_model import write_bpe_model
from tests.support.trl_cli_truth import trl_cli_verdict
from warmup.cli import main

REAL = Path(__file__).resolve().parents[2] / "real_configs"
HANDBOOK_ZERO3 = Path(__file__).resolve().parents[2] / "fixtures" / "alignment-handbook-zero3.yaml"
# The recipes alignment-handbook's READMEs launch with recipes/accelerate_configs/zero3.yaml (commit 925acdfe).
HANDBOOK_ZERO3_RECIPES = {
    "recipes-constitutional-ai-sft-config_anthropic.yaml": "sft",
    "recipes-constitutional-ai-sft-config_grok.yaml": "sft",
    "recipes-constitutional-ai-dpo-config_anthropic.yaml": "dpo",
    "recipes-smollm-sft-config.yaml": "sft",
    "recipes-smollm2-sft-config.yaml": "sft",
    "recipes-smollm2-sft-config_smol.yaml": "sft",
    "recipes-smollm2-dpo-config.yaml": "dpo",
    "recipes-smollm2-dpo-config_smol.yaml": "dpo",
    "recipes-smollm3-sft-mid.yaml": "sft",
    "recipes-smollm3-sft-sft.yaml": "sft",
    "recipes-smollm3-dpo-apo.yaml": "dpo",
    "recipes-starchat2-15b-sft-config_v0.1.yaml": "sft",
    "recipes-starchat2-15b-dpo-config_v0.1.yaml": "dpo",
    "recipes-zephyr-7b-beta-sft-config_full.yaml": "sft",
    "recipes-zephyr-7b-beta-dpo-config_full.yaml": "dpo",
    "recipes-zephyr-7b-gemma-sft-config_full.yaml": "sft",
    "recipes-zephyr-7b-gemma-dpo-config_full.yaml": "dpo",
}
DEEPSPEED_ON_NEURON = ("DeepSpeed has no Neuron accelerator", "accelerate_config: fsdp2")
FSDP1_ON_NEURON = ("TorchNeuron documents FSDP2", "fsdp_version: 2")
FSDP1_ON_CPU = ("FSDP1 (FullyShardedDataParallel) does not run on CPU", "fsdp_version: 2")
# preset -> target -> the sharding every signature carries (exit 0), or what the refusal must name (exit 2)
EXPECTED: dict[str, dict[str, str | tuple[str, str] | None]] = {
    "multi_gpu": {"cpu": None, "cuda": None, "neuron": None},
    "zero1": {"cpu": "zero1", "cuda": "zero1", "neuron": DEEPSPEED_ON_NEURON},
    "zero2": {"cpu": "zero2", "cuda": "zero2", "neuron": DEEPSPEED_ON_NEURON},
    "zero3": {"cpu": "zero3", "cuda": "zero3", "neuron": DEEPSPEED_ON_NEURON},
    "fsdp1": {"cpu": FSDP1_ON_CPU, "cuda": "fsdp1", "neuron": FSDP1_ON_NEURON},
    "fsdp2": {"cpu": "fsdp2", "cuda": "fsdp2", "neuron": "fsdp2"},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_bpe_model(tmp_path_factory.mktemp("sharded-plan-model"))


def plan(config: Path, trainer: str, target: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["plan", str(config), "--trainer", trainer, "--target", target, "--format", "json"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_trls_presets_plan_with_their_wrapper_or_name_the_mode_that_works(preset, model, tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": str(model),
                "accelerate_config": preset,
                "torch_compile": True,
                "use_cpu": True,
                "max_length": 256,
                "pad_to_multiple_of": 128,
            }
        )
    )
    for target, expected in EXPECTED[preset].items():
        code, out, err = plan(config, "sft", target)
        if isinstance(expected, tuple):
            assert code == 2, (target, out)
            assert all(words in err for words in expected), (target, err)
            continue
        assert code == 0, (target, err)
        planned = json.loads(out)
        assert planned["signatures"], target
        assert {s["sharding"] for s in planned["signatures"]} == {expected}, target
        assert all(s["world_size"] == 8 for s in planned["signatures"])  # the preset's num_processes
        if expected is not None:
            mode = "ZeRO" if preset.startswith("zero") else "FSDP"
            assert any(mode in note for note in planned["notes"]), planned["notes"]


@pytest.mark.parametrize("name", list(HANDBOOK_ZERO3_RECIPES))
def test_alignment_handbooks_zero3_recipes_plan_on_gpu_and_are_refused_on_neuron(name, model, tmp_path):
    """Each recipe as its README launches it (zero3.yaml); TRL 1.16 refuses every one of them for fields of older
    releases, so the plan names those first (exit 2). With the fixes it names applied, the recipe plans ZeRO-3
    signatures for GPUs and is refused on Neuron with the mode that works."""
    trainer = HANDBOOK_ZERO3_RECIPES[name]
    data = yaml.safe_load((REAL / "alignment-handbook" / name).read_text())
    # padded as on Neuron: unpadded, a recipe plans each of its 2048 lengths and is refused as too large (exit 2)
    data.update(model_name_or_path=str(model), accelerate_config=str(HANDBOOK_ZERO3), pad_to_multiple_of=128)
    config = tmp_path / name
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = plan(config, trainer, "cuda")
    if code == 2:
        assert not trl_cli_verdict(trainer, config)[0], err
        config.write_text(yaml.safe_dump(with_fixes(data, err), sort_keys=False))
        assert trl_cli_verdict(trainer, config)[0], err
        code, out, err = plan(config, trainer, "cuda")
    assert code == 0, err
    planned = json.loads(out)
    assert planned["signatures"] and {s["sharding"] for s in planned["signatures"]} == {"zero3"}
    assert any("DeepSpeed ZeRO-3" in note for note in planned["notes"]), planned["notes"]
    code, _, err = plan(config, trainer, "neuron")
    assert code == 2 and all(words in err for words in DEEPSPEED_ON_NEURON), err


def with_fixes(data: dict, err: str) -> dict:
    """The config with the fix the plan names for each refused field: the replacement field, the renamed value, or
    without the field (a template text, a handbook dataset mixture, a removed field)."""
    fixed = dict(data)
    for field, fix in re.findall(r"^\s*args\.(\w+): (.*)$", err, flags=re.MULTILINE):
        value = fixed.pop(field)
        if renamed := re.search(r"use `(\w+)` instead", fix):
            fixed[renamed.group(1)] = value
        elif renamed := re.search(rf"{field}: (\w+)$", fix):
            fixed[field] = renamed.group(1)
    return fixed
