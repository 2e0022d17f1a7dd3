"""Write warmup/data/trl_cli_fields.json: what `trl <trainer> --config` reads besides the trainer config.

A trl config file is one flat mapping for several dataclasses. Sorting its keys into the model
(ModelConfig), the dataset selection and the script's own arguments is what turns it into a spec, and
a training pod does it with the base install, where TRL may be missing and must not be imported: so the
field lists are taken from the installed TRL here, once, and shipped as data. `tests/unit/test_spec.py`
holds the file to the installed TRL (it fails, naming this script, when TRL changes them).

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
    import trl
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
        scripts[trainer] = {"dataset": sorted(dataset), "script": sorted(script - dataset)}
    presets = {}
    for preset in resources.files("trl.accelerate_configs").iterdir():
        if preset.name.endswith(".yaml"):
            presets[preset.name.removesuffix(".yaml")] = yaml.safe_load(preset.read_text()) or {}
    root = Path(trl.__file__).parent / "experimental"
    experimental = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_"))
    return {
        "about": "Fields of the dataclasses `trl <trainer> --config` parses besides the trainer config, the "
        "content of TRL's accelerate presets, and the trainers under trl.experimental; written by "
        "tools/trl_cli_fields.py from the installed TRL.",
        "trl": trl.__version__,
        "model": fields(ModelConfig),
        "scripts": scripts,
        "accelerate_presets": dict(sorted(presets.items())),
        "experimental_trainers": [name for name in experimental if name not in TRAINERS],
    }


if __name__ == "__main__":
    json.dump(build(), sys.stdout, indent=1)
    sys.stdout.write("\n")
