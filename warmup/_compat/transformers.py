"""transformers' private names, in one place: building a model of a class that has no public `from_config`, the
chat template's compiled form that the data facts render conversations with, the Trainer that is running a
callback, found from the call stack, and the patch of `Trainer.__init__` that `warmup exec`'s processes install.

Written against transformers 5.24.0; checked on transformers 5.24.0 and 5.25.0 (`CHECKED_ON`). `check()`
resolves every target (tests/unit/test_compat.py). Importing this module imports no transformers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from warmup._compat import targets
from warmup._compat.targets import Target
from warmup.errors import IncompatibleLibraryError

LIBRARY = "transformers"
CHECKED_ON = ("5.24.0", "5.25.0")

_CHAT = "transformers.utils.chat_template_utils"
TARGETS = (
    Target("transformers", "PreTrainedModel._from_config", "model_from_config", ("config",)),
    Target(_CHAT, "_REASONING_FIELDS", "chat_template_compiler"),
    Target(_CHAT, "_compile_jinja_template", "chat_template_compiler", ("chat_template",)),
    Target(
        "transformers.trainer_callback",
        "CallbackHandler.call_event",
        "trainer_running",
        ("self", "event", "args", "state", "control"),
    ),
    Target("transformers.trainer", "Trainer.__init__", "wrap_trainer_init", ("self", "model", "args")),
)
# How far up the stack from a callback's event the Trainer method that called the handler is.
_TRAINER_FRAMES = 12


def check() -> list[str]:
    """Every target of this seam that does not hold at the installed transformers, one line each."""
    return targets.check(LIBRARY, CHECKED_ON, TARGETS)


def model_from_config(architecture: Any, config: Any, **kwargs: Any) -> Any:
    """A model of `architecture` with weights initialised from `config`: its public `from_config` (the Auto
    classes), else the model class's own `_from_config`, which `from_config` calls."""
    if hasattr(architecture, "from_config"):
        return architecture.from_config(config, **kwargs)
    targets.resolve(LIBRARY, CHECKED_ON, TARGETS[0])
    kwargs.pop("trust_remote_code", None)  # the Auto classes' option; a model class takes its own code
    return architecture._from_config(config, **kwargs)


def chat_template_compiler() -> tuple[frozenset[str], Callable[[str], Any]] | None:
    """The message fields transformers prepares before rendering a chat template (its reasoning fields), and
    its function that compiles a template; None where this transformers has them no more (then a caller
    takes transformers' public path only)."""
    try:
        fields = targets.resolve(LIBRARY, CHECKED_ON, TARGETS[1])
        compile_template = targets.resolve(LIBRARY, CHECKED_ON, TARGETS[2])
    except IncompatibleLibraryError:
        return None
    return frozenset(fields), compile_template


def trainer_running(callback: Any) -> Any:
    """The Trainer whose callback handler is running `callback` (one of its events), or None: transformers calls
    events from Trainer methods through `CallbackHandler.call_event`, so it is a `self` a few frames up whose
    handler holds the callback. Called from the callback's event."""
    targets.resolve(LIBRARY, CHECKED_ON, TARGETS[3])
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_TRAINER_FRAMES):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        handler = getattr(candidate, "callback_handler", None)
        if hasattr(candidate, "model_wrapped") and any(
            c is callback for c in getattr(handler, "callbacks", ())
        ):
            return candidate
    return None


def wrap_trainer_init(
    trainer_module: Any, wrap: Callable[[Callable[..., None]], Callable[..., None]]
) -> None:
    """Replace `Trainer.__init__` by `wrap(the original)`, so that every Trainer (TRL's among them) runs what
    `wrap` adds around its construction. `trainer_module`: `transformers.trainer` (as an import hook has it)."""
    targets.resolve(LIBRARY, CHECKED_ON, TARGETS[4])
    trainer = trainer_module.Trainer
    trainer.__init__ = wrap(trainer.__init__)
