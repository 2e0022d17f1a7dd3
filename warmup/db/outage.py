"""Database outages (a restart, a failover, a dropped connection): which errors mean "the database is
unavailable, try again", and a way for a long-running process to ride one out.

The API answers such errors with 503 + Retry-After (api.errors); a worker calls the operation again
with backoff until the database answers (`Outage`), logging once when an outage starts and once when
it ends, not once per attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

log = logging.getLogger("warmup.db")


def is_unavailable(error: BaseException) -> bool:
    """True for errors that go away when the database answers again: connection refused or
    terminated (server restart, admin shutdown), "starting up", a timeout connecting, a connection
    the pool found dead. Not for errors in the statement itself (integrity, syntax)."""
    if not isinstance(error, DBAPIError):
        return False
    return error.connection_invalidated or isinstance(error, (OperationalError, InterfaceError))


def reason(error: BaseException) -> str:
    """The first line of the driver's message ("connection refused", "the database system is
    starting up"), without SQLAlchemy's statement and parameters."""
    lines = str(getattr(error, "orig", None) or error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class Outage:
    """Runs database operations again while the database is unavailable.

    Backoff from `first_delay_s`, doubling up to `max_delay_s`, until the operation succeeds or `stop`
    is set (then the last error is raised). Until the database has answered once, errors are raised
    at once: a wrong URL or a server that is not there at start-up is a configuration error to report,
    not an outage to wait out. Thread-safe: a worker's loop and its heartbeat thread share one, so an
    outage is logged once however many calls wait it out.
    """

    def __init__(
        self,
        stop: threading.Event | None = None,
        *,
        first_delay_s: float = 0.25,
        max_delay_s: float = 2.0,
        logger: logging.Logger = log,
    ) -> None:
        self.stop = stop or threading.Event()
        self.first_delay_s, self.max_delay_s = first_delay_s, max_delay_s
        self.log = logger
        self.outages = 0  # how many outages this process has ridden out (or is riding out)
        self._answered = False  # the database has answered at least once
        self._down_since: float | None = None
        self._lock = threading.Lock()

    def call(self, operation: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        delay = self.first_delay_s
        while True:
            try:
                result = operation(*args, **kwargs)
            except Exception as error:
                if not (self._answered and is_unavailable(error)) or self.stop.is_set():
                    raise
                self._went_down(error)
                if self.stop.wait(delay):
                    raise
                delay = min(delay * 2, self.max_delay_s)
                continue
            self._came_back()
            return result

    def _went_down(self, error: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
            self.outages += 1
        self.log.warning(
            "database unavailable (%s): retrying with backoff up to %.0fs until it answers",
            reason(error),
            self.max_delay_s,
        )

    def _came_back(self) -> None:
        self._answered = True
        if self._down_since is None:  # the usual case: no lock taken
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            self.log.warning("database answers again after %.1fs unavailable", time.monotonic() - since)


class _RidingOut:
    def __init__(self, target: object, outage: Outage) -> None:
        self._target, self._outage = target, outage

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._outage.call(attribute, *args, **kwargs)

        return call


def riding_out(target: T, outage: Outage) -> T:
    """`target` with each public method called through `outage.call`.

    Only for objects whose every public method is one transaction (TaskQueue, Repository): a
    transaction cut by the outage was rolled back, so calling the method again is safe.
    """
    return cast(T, _RidingOut(target, outage))
