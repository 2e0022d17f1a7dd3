"""What TRL 1.16's own CLI says about a config: does `trl <trainer> --config FILE` get as far as training?

The steps are TRL's, in its order (trl/cli/commands/training.py, then the launched script): the training
script's TrlParser reads the config (values into its dataclasses, the rest as launcher arguments),
`accelerate_config` is resolved, TRL's `launch_training_script` hands the line to accelerate's launch parser and
to `launch_command`, which here stops short of starting processes: it runs accelerate's `_validate_launch_command`
(the config file read, its precedence and checks) and checks that the training script is TRL's (a flag that takes
no value leaves the YAML value in the script's place). Then the script, once launched, parses the config again
into its dataclasses.

The dataclasses' checks of the machine (bf16 / tf32 support, DeepSpeed installed) would refuse any GPU config on
this CPU-only machine; the script-side parse neutralises them as the planner does (warmup.job.trl_config
MACHINE_CHECKED): the fields are set to their neutral values in a copy of the file, so a config TRL accepts on the
machine it targets is judged accepted (both parses read that copy: the keys handed to the launcher are the same). The default accelerate config of this machine is not read (the job's
machine has its own, or none). Relative paths are read from the working directory, as `trl` reads them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import tempfile
from pathlib import Path
from unittest import mock

import yaml

from warmup.job.trl_config import MACHINE_CHECKED


class _NotTrlScript(Exception):
    pass


def trl_cli_verdict(trainer: str, config: Path) -> tuple[bool, str]:
    """(accepted, TRL's own error message when it refuses)."""
    import accelerate.commands.launch as accelerate_launch
    from trl.cli.accelerate_config import resolve_accelerate_config_argument
    from trl.cli.accelerate_launcher import launch_training_script
    from trl.cli.commands import get_commands

    if trainer not in {command.name for command in get_commands()}:
        return False, f"trl has no command {trainer!r}"
    module = importlib.import_module(f"trl.scripts.{trainer}")
    script = f"{trainer}.py"

    def launch_command(args) -> None:  # accelerate's launch_command, up to starting the processes
        accelerate_launch._validate_launch_command(args)
        if Path(args.training_script).name != script:
            raise _NotTrlScript(
                f"accelerate launch would run {args.training_script!r} as the training script (a flag that takes "
                "no value was given one)"
            )

    environ = dict(os.environ)  # `env:` in a config sets variables
    said = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch:
        neutral = Path(scratch) / Path(config).name
        try:
            with (
                contextlib.redirect_stderr(said),
                contextlib.redirect_stdout(io.StringIO()),
                mock.patch.object(accelerate_launch, "default_config_file", str(Path(scratch) / "none.yaml")),
            ):
                neutral.write_text(yaml.safe_dump(_neutralised(config)))
                argv = ["--config", str(neutral)]
                parser = module.make_parser(prog=f"trl {trainer}")
                *_, config_remaining, cli_remaining = parser.parse_args_and_config(
                    argv, return_remaining_strings=True, separate_remaining_strings=True
                )
                launch_args = resolve_accelerate_config_argument(config_remaining + cli_remaining)
                launch_training_script(
                    script_name=script,
                    launch_args=launch_args,
                    training_script_args=argv,
                    launch_command_fn=launch_command,
                )
                module.make_parser().parse_args_and_config(argv, fail_with_unknown_args=False)
        except SystemExit:
            return False, said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "exit"
        except Exception as error:  # TRL's, accelerate's and transformers' own checks raise ValueError, ...
            return False, f"{type(error).__name__}: {error}"
        finally:
            os.environ.clear()
            os.environ.update(environ)
    return True, ""


def _neutralised(config: Path) -> dict:
    """The config with the fields that check the machine at their neutral values (a None value: left unset)."""
    data = yaml.safe_load(Path(config).read_text())
    if not isinstance(data, dict):
        return data
    for name, value in MACHINE_CHECKED.items():
        data.pop(name, None)
        if value is not None:
            data[name] = value
    return data
