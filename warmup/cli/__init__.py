"""The `warmup` command: one module per command group, and nothing in the project imports them.

- `local`: plan and warm on this machine;
- `facts`: the data facts of a job's dataset;
- `advise`: compare padding settings of a job on its dataset's lengths;
- `submit`: submit a job to the service (CI pre-warming), print this machine's toolchain;
- `pod`: pull, exec and coverage, for training pods (base install only);
- `service`: serve, worker, token and gc, for the service's own machines;
- `store`: `store check`, the blob store read back against the database;
- `selftest`: the zero-compile proof on this machine (tiny jobs warmed, then trained fresh);
- `doctor`: this environment's versions against the tested stacks, and the features off here.

Each command imports what it needs when it runs, so `warmup pull` on a training pod starts fast and
needs only the base install. Errors a user can cause print as one line and exit non-zero (2: invalid
spec); they never print a traceback. What libraries log while a command reads a job (transformers' advice
for a training run that is not happening here) is kept off the screen in one place: `quiet.quiet_libraries`.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

from warmup import __version__
from warmup.cli import advise, doctor, facts, local, pod, quiet, selftest, service, store, submit
from warmup.errors import SpecError, WarmupError


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command`, the service's commands get their options only when it is
    one of them: those options come from the server's settings class, whose import (pydantic-settings)
    a training pod's `warmup pull` must not pay."""
    parser = argparse.ArgumentParser(
        prog="warmup",
        description="Pre-warm compile caches for TRL training jobs (Trainium and torch.compile).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="`warmup COMMAND --help` shows its options"
    )
    local.register(sub)
    facts.register(sub)
    advise.register(sub)
    service.register(sub, with_options=command is None or command in service.COMMANDS)
    store.register(sub, with_options=command is None or command in store.COMMANDS)
    submit.register(sub)
    pod.register(sub)
    selftest.register(sub)
    doctor.register(sub)
    return parser


def describe(error: WarmupError) -> str:
    """One line, or for a spec with several problems one line per problem, each with its field."""
    problems = getattr(error, "problems", None)
    if isinstance(error, SpecError) and problems and len(problems) > 1:
        return f"invalid spec ({len(problems)} problems):\n" + "\n".join(f"  {p}" for p in problems)
    return str(error)


def _reject_unknown(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit 2 with the command's own usage (argparse would print the top level's) and the option meant,
    where one is close: `warmup pull --cache_dir D` says `did you mean --cache-dir?`."""
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command_parser: argparse.ArgumentParser = commands.choices[command]
    known = [option for action in command_parser._actions for option in action.option_strings]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    for option in (word.split("=")[0] for word in unknown if word.startswith("-")):
        if close := difflib.get_close_matches(option, known, n=1):
            message += f" (did you mean {close[0]}?)"
            break
    command_parser.error(message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        _reject_unknown(parser, ns.command, unknown)
    ns.command_argv = argv[1:]  # the command's own arguments (a worker supervisor re-executes with them)
    if ns.command in quiet.QUIET_COMMANDS:
        quiet.quiet_libraries()
    try:
        return int(ns.func(ns))
    except WarmupError as error:
        print(f"error: {describe(error)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
