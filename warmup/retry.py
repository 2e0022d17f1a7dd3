"""The product's one retry loop: a call retried on transient failures with capped exponential backoff,
for at most a number of attempts and a time budget. The client's calls to the service and its downloads
wait out a service restart (`RESTART`); a dropped keep-alive connection and a broken S3 read are tried
again at once (`at_once`).

The budget is long enough for the service to restart (it answers again within seconds, and is ready once
it has imported TRL and computed its worker's toolchain: docs/performance.md, "Riding out a restart"), so a
pull or `submit --wait` lives through one; `WARMUP_RETRY_S` changes it (a CI job that would rather fail fast
sets it low).
Pod-side: the standard library only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

RETRY_VARIABLE = "WARMUP_RETRY_S"
DEFAULT_RETRY_S = 60.0


def retry_budget_s() -> float:
    """How long a client keeps retrying a service that does not answer: WARMUP_RETRY_S, else 60 s."""
    try:
        return max(0.0, float(os.environ.get(RETRY_VARIABLE) or DEFAULT_RETRY_S))
    except ValueError:
        return DEFAULT_RETRY_S


@dataclass(frozen=True)
class Backoff:
    """Delays of 0.5 s, 1 s, 2 s ... up to `max_delay_s`, for at most `attempts` tries and `budget_s`
    seconds from the first (None: `retry_budget_s()`, read when the retries start)."""

    first_delay_s: float = 0.5
    max_delay_s: float = 8.0
    attempts: int = 1_000_000
    budget_s: float | None = None


RESTART = Backoff()  # for as long as the service takes to restart


def at_once(attempts: int) -> Backoff:
    """Up to `attempts` tries back to back, without a time budget: for a failure the next try mends by
    itself (a connection opened again, a read resumed where it broke)."""
    return Backoff(first_delay_s=0.0, max_delay_s=0.0, attempts=attempts, budget_s=math.inf)


def retrying(
    call: Callable[[], T],
    *,
    transient: Callable[[BaseException], bool],
    backoff: Backoff = RESTART,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call()`, again after a delay each time it raises an error `transient` accepts, until it returns,
    raises another error, or the attempts or the time budget run out (then its last error is raised).
    An error with a `retry_after_s` attribute (a service that said when to come back) waits that long
    at least, and the backoff doubles from there. `sleep` is time.sleep, looked up when it sleeps."""
    budget = retry_budget_s() if backoff.budget_s is None else backoff.budget_s
    started = clock()
    delay = backoff.first_delay_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except BaseException as error:
            if not transient(error):
                raise
            told = float(getattr(error, "retry_after_s", 0.0))
            wait = max(delay, told)
            if attempt >= backoff.attempts or clock() - started + wait > budget:
                raise
        if wait > 0:
            (sleep or time.sleep)(wait)
        delay = min(wait * 2, max(backoff.max_delay_s, 2 * told))
