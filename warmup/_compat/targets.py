"""What a seam reaches and how it is checked: a private name of a library, the seam function that uses it, and
the leading parameters that function passes it."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from warmup.errors import IncompatibleLibraryError


@dataclass(frozen=True)
class Target:
    module: str
    attribute: str | None  # dotted within the module (`Class.method`); None: the module itself
    used_by: str  # the seam function that reaches it
    parameters: tuple[str, ...] = ()  # the leading parameter names the seam passes (positionally)


def resolve(library: str, checked_on: tuple[str, ...], target: Target) -> Any:
    """The object `target` names, or IncompatibleLibraryError naming the seam function and the versions the
    seam was checked on."""
    try:
        found: Any = importlib.import_module(target.module)
        for part in target.attribute.split(".") if target.attribute else ():
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise incompatible(library, checked_on, target, f"is gone ({error})") from None
    if target.parameters:
        try:
            names = tuple(inspect.signature(found).parameters)
        except (TypeError, ValueError):
            names = ()
        if names[: len(target.parameters)] != target.parameters:
            raise incompatible(
                library,
                checked_on,
                target,
                f"takes ({', '.join(names)}), not ({', '.join(target.parameters)}, ...)",
            )
    return found


def check(library: str, checked_on: tuple[str, ...], targets: tuple[Target, ...]) -> list[str]:
    """Every target of a seam that does not hold at the installed version, as one line each."""
    problems = []
    for target in targets:
        try:
            resolve(library, checked_on, target)
        except IncompatibleLibraryError as error:
            problems.append(str(error))
    return problems


def incompatible(
    library: str, checked_on: tuple[str, ...], target: Target, what: str
) -> IncompatibleLibraryError:
    """The error for a target that does not hold as the seam needs it: `what` says how (its name's module and
    attribute first)."""
    name = target.module + (f".{target.attribute}" if target.attribute else "")
    try:
        installed = metadata.version(library)
    except metadata.PackageNotFoundError:
        installed = "not installed"
    return IncompatibleLibraryError(
        f"{library} {installed}: {name} {what}; trl-warmup's {target.used_by} needs it "
        f"(checked on {library} {', '.join(checked_on)})"
    )
