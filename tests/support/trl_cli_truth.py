"""What TRL 1.16's own CLI says about a config: does `trl <trainer> --config FILE` get as far as training?

The steps are TRL's, in its order (trl/cli/commands/training.py, then the launched script): the training
script's TrlParser reads the config (values into its dataclasses, the rest as launcher arguments),
`accelerate_config` is resolved, accelerate's launch parser takes the launcher arguments, and the script,
once launched, parses the config again into its dataclasses. Nothing is launched. The dataclasses' checks
of the machine (bf16 / tf32 support, GPUs) would fail on a CPU-only test machine for any GPU config, so
the script-side parse runs with `--use_cpu true`, as a CPU run of that config would.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from pathlib import Path


def trl_cli_verdict(trainer: str, config: Path) -> tuple[bool, str]:
    """(accepted, TRL's own error message when it refuses)."""
    from accelerate.commands.launch import launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument
    from trl.cli.commands import get_commands

    if trainer not in {command.name for command in get_commands()}:
        return False, f"trl has no command {trainer!r}"
    module = importlib.import_module(f"trl.scripts.{trainer}")
    argv = ["--config", str(config)]
    environ = dict(os.environ)  # `env:` in a config sets variables
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser = module.make_parser(prog=f"trl {trainer}")
            *_, config_remaining, cli_remaining = parser.parse_args_and_config(
                [*argv, "--use_cpu", "true"], return_remaining_strings=True, separate_remaining_strings=True
            )
            launch_args = resolve_accelerate_config_argument(config_remaining + cli_remaining)
            launch_command_parser().parse_args([*launch_args, "train.py", *argv])
            module.make_parser().parse_args_and_config(
                [*argv, "--use_cpu", "true"], fail_with_unknown_args=False
            )
    except SystemExit:
        return False, said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "exit"
    except Exception as error:  # TRL's and transformers' own checks raise ValueError, TypeError, ...
        return False, f"{type(error).__name__}: {error}"
    finally:
        os.environ.clear()
        os.environ.update(environ)
    return True, ""
