"""Write warmup/data/trl_cli_fields.json: what `trl <trainer> --config` reads, and what it hands to accelerate.

A trl config file is one flat mapping for several dataclasses. Sorting its keys into the model
(ModelConfig), the dataset selection and the script's own arguments is what turns it into a spec, and
a training pod does it with the base install, where TRL may be missing and must not be imported: so the
field lists are taken from the installed TRL here, once, and shipped as data. `tests/unit/test_spec.py`
holds the file to the installed TRL and accelerate (it fails, naming this script, when either changes them).

    python tools/trl_cli_fields.py > warmup/data/trl_cli_fields.json
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from importlib import resources
from pathlib import Path

import yaml

TRAINERS = ("sft", "dpo", "kto", "reward", "grpo", "rloo", "distillation")


def fields(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls) if f.init)


def build() -> dict:
    import accelerate
    import trl
    from accelerate.commands.launch import launch_command_parser
    from transformers import TrainingArguments
    from trl.scripts.utils import DatasetMixtureConfig, ScriptArguments
    from trl.trainer.model_config import ModelConfig

    scripts = {}
    for trainer in TRAINERS:
        module = importlib.import_module(f"trl.scripts.{trainer}")
        own = [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, ScriptArguments)
            and value.__module__ == module.__name__
        ]
        script = set(fields(own[0] if own else ScriptArguments))
        dataset = set(fields(DatasetMixtureConfig)) | {name for name in script if name.startswith("dataset_")}
        config = next(c for c in module.make_parser().dataclass_types if issubclass(c, TrainingArguments))
        scripts[trainer] = {
            "dataset": sorted(dataset),
            "script": sorted(script - dataset),
            "trainer": sorted(set(fields(config)) - set(fields(TrainingArguments))),
        }
    presets = {}
    for preset in resources.files("trl.accelerate_configs").iterdir():
        if preset.name.endswith(".yaml"):
            presets[preset.name.removesuffix(".yaml")] = yaml.safe_load(preset.read_text()) or {}
    root = Path(trl.__file__).parent / "experimental"
    experimental = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_"))
    return {
        "about": "Fields of the dataclasses `trl <trainer> --config` parses (TrainingArguments', each trainer "
        "config's own, the script's), the options of accelerate's launch parser, the content of TRL's accelerate "
        "presets, and the trainers under trl.experimental; written by tools/trl_cli_fields.py from the installed "
        "TRL and accelerate.",
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
        "model": fields(ModelConfig),
        "training_arguments": fields(TrainingArguments),
        "scripts": scripts,
        # every option string of `accelerate launch` (without `--`): the keys a trl config hands to it
        "accelerate_launch": sorted(
            option[2:]
            for action in launch_command_parser()._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        ),
        "accelerate_presets": dict(sorted(presets.items())),
        "experimental_trainers": [name for name in experimental if name not in TRAINERS],
    }


if __name__ == "__main__":
    json.dump(build(), sys.stdout, indent=1)
    sys.stdout.write("\n")
