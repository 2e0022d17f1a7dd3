"""Library noise kept off the screen of the commands that read a job: filtered here, in one place."""

from __future__ import annotations

import os

# transformers' verbosity, read once as it is first imported. A command that reads a job builds TRL's and
# transformers' config classes, which log advice meant for a training run ("the speedups for torchdynamo
# mostly come with GPU Ampere ...") that is not happening in this process: only their errors are shown.
# The services keep their libraries' warnings (their logs are read), and `warmup exec` gives the training
# command the environment it was started with (pod.py).
LIBRARY_VERBOSITY = "TRANSFORMERS_VERBOSITY"
QUIET_COMMANDS = frozenset(
    {"plan", "warm", "facts", "advise", "submit", "pull", "exec", "coverage", "selftest"}
)


def quiet_libraries() -> None:
    """Only errors from transformers' logger in this process, unless the user chose a verbosity: the one place
    library noise is filtered. `quieted()` tells `warmup exec` to leave it out of the training command's
    environment."""
    if LIBRARY_VERBOSITY not in os.environ:
        os.environ[LIBRARY_VERBOSITY] = "error"
        _QUIETED.append(LIBRARY_VERBOSITY)


_QUIETED: list[str] = []


def quieted() -> list[str]:
    """The variables `quiet_libraries` set that the user had not: not for the training command's environment."""
    return list(_QUIETED)
