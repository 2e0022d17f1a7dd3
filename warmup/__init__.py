"""trl-warmup: pre-warm compile caches for TRL training jobs.

`import warmup` stays light: `warmup.activate` (and `Activation`) load on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Activation", "activate"]


def __getattr__(name: str) -> Any:
    if name in ("activate", "Activation"):
        from warmup import activation as module

        return getattr(module, name)
    raise AttributeError(f"module 'warmup' has no attribute {name!r}")
