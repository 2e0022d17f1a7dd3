"""What `trl <trainer> --config` reads, and what it hands to accelerate, taken from the installed TRL, accelerate
and transformers.

A trl config file is one flat mapping for several dataclasses. Sorting its keys into the model (ModelConfig),
the dataset selection and the script's own arguments is what turns it into a spec (`warmup.job.spec`), and every
release may move a field (accelerate 1.16 dropped `fp8_opt_level` from its launch options). So the lists come
from the packages installed here: computed once for each set of versions (this imports TRL, so a few seconds)
and remembered beside the image's toolchain memo, where `warmup doctor` (or any command reading a trl config)
leaves them for every later process. `warmup/data/trl_cli_fields.json` holds the lists of the locked stack, for
a base install without TRL (tools/trl_cli_fields.py writes it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from warmup.trainers.registry import FAMILIES

# The packages whose versions the lists depend on: TRL's scripts, accelerate's launch parser, transformers'
# TrainingArguments.
PACKAGES = ("trl", "accelerate", "transformers")


def _fields(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls) if f.init)


def build() -> dict[str, Any]:
    """The lists, from the installed TRL, accelerate and transformers (imports them)."""
    import accelerate
    import transformers
    import trl
    from accelerate.commands.launch import launch_command_parser
    from transformers import TrainingArguments
    from trl.scripts.utils import DatasetMixtureConfig, ScriptArguments
    from trl.trainer.model_config import ModelConfig

    scripts = {}
    for trainer in FAMILIES:
        module = importlib.import_module(f"trl.scripts.{trainer}")
        own = [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, ScriptArguments)
            and value.__module__ == module.__name__
        ]
        script = set(_fields(own[0] if own else ScriptArguments))
        dataset = set(_fields(DatasetMixtureConfig)) | {
            name for name in script if name.startswith("dataset_")
        }
        config = next(c for c in module.make_parser().dataclass_types if issubclass(c, TrainingArguments))
        scripts[trainer] = {
            "dataset": sorted(dataset),
            "script": sorted(script - dataset),
            "trainer": sorted(set(_fields(config)) - set(_fields(TrainingArguments))),
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
        "presets, and the trainers under trl.experimental; written by warmup.job.trl_fields from the installed "
        "TRL, accelerate and transformers.",
        "trl": trl.__version__,
        "accelerate": accelerate.__version__,
        "transformers": transformers.__version__,
        "model": _fields(ModelConfig),
        "training_arguments": _fields(TrainingArguments),
        "scripts": scripts,
        # every option string of `accelerate launch` (without `--`): the keys a trl config hands to it
        "accelerate_launch": sorted(
            option[2:]
            for action in launch_command_parser()._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        ),
        "accelerate_presets": dict(sorted(presets.items())),
        "experimental_trainers": [name for name in experimental if name not in FAMILIES],
    }


def _memo_name(versions: dict[str, str]) -> str:
    return "trl-cli-fields-" + "-".join(f"{name}{versions[name]}" for name in PACKAGES) + ".json"


def _memo_folders(*, for_writing: bool) -> list[Path]:
    """Beside the image's toolchain memo (`warmup toolchain --remember` in an image build), else the user's
    cache: where a later process of the same install looks."""
    from warmup.toolchain.memo import image_memo_path

    paths = [image_memo_path(for_writing=True)]
    if not for_writing:
        paths.insert(0, image_memo_path())
    return [path.parent for path in paths if path is not None]


def fields_for(versions: dict[str, str]) -> dict[str, Any]:
    """The lists for the installed `versions` (PACKAGES' versions, as installed): remembered, else built and
    remembered where that can be written."""
    name = _memo_name(versions)
    for folder in _memo_folders(for_writing=False):
        with contextlib.suppress(OSError, ValueError):
            remembered = json.loads((folder / name).read_text())
            if isinstance(remembered, dict) and all(remembered.get(p) == versions[p] for p in PACKAGES):
                return remembered
    built = build()
    for folder in _memo_folders(for_writing=True):
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
            with os.fdopen(fd, "w") as out:
                os.fchmod(out.fileno(), 0o644)
                json.dump(built, out)
            os.replace(temp, folder / name)
    return built
