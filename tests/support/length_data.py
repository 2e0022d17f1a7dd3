"""Generated datasets of known length distributions, as token counts (seeded, so every run is the same).

- uniform: every length in [low, high] equally likely;
- bimodal: short answers and long documents, two normal modes;
- long_tailed: Pareto, most examples short and a few very long (chat logs, code files).
"""

from __future__ import annotations

import random
from collections.abc import Callable

Distribution = Callable[[random.Random, int, int, int], list[int]]


def uniform(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(n)]


def bimodal(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    modes = (low + (high - low) * 0.15, low + (high - low) * 0.8)
    spread = (high - low) * 0.06
    return [_clip(round(rng.gauss(modes[rng.random() < 0.35], spread)), low, high) for _ in range(n)]


def long_tailed(rng: random.Random, n: int, low: int, high: int) -> list[int]:
    scale = (high - low) * 0.05
    return [_clip(round(low + scale * (rng.paretovariate(1.1) - 1)), low, high) for _ in range(n)]


DISTRIBUTIONS: dict[str, Distribution] = {"uniform": uniform, "bimodal": bimodal, "long_tailed": long_tailed}


def _clip(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))
