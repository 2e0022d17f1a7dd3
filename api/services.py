"""What the routes work with, built once per app from the settings: database, queue, store, caches.

Planning a spec reads its model config and builds TRL's config class; pods ask for the same spec's
manifest many times, so plans are cached by spec key, and complete manifests by (spec, toolchain)
for a fraction of the presigned URLs' lifetime.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from sqlalchemy import Engine, text

from warmup.advise.advice import Advice, advise
from warmup.db.engine import make_engine
from warmup.db.integrity import check_store, damaged_blobs
from warmup.db.migrate import upgrade
from warmup.db.queue import TaskQueue
from warmup.db.repository import Repository
from warmup.db.tokens import TokenStore
from warmup.errors import PlanTooLargeError, SpecError, WarmupError
from warmup.job.spec import LOCAL_PATH_ARGS, LOCAL_PATH_FIELDS, Spec
from warmup.job.trl_args import warm_up_trl
from warmup.planner.estimate import CompileCosts, typical_seconds
from warmup.planner.planning import plan_spec
from warmup.settings import Settings
from warmup.signature import Plan, Signature
from warmup.store import BlobStore, open_store
from warmup.toolchain.model import Toolchain
from warmup.trainers.registry import family

# A revoked token is refused, and a manifest naming a blob the store check found damaged is no longer
# answered from memory, within this many seconds by every API process: each reads the revocations and the
# damage (a small query each) at most this often, and forgets what it cached when they change.
REVOCATION_CHECK_S = 1.0

log = logging.getLogger("warmup.api")
K = TypeVar("K")
V = TypeVar("V")


class ChangeWatch:
    """A value in the database read at most every `every_s` seconds; `on_change` (which forgets what a
    cache holds) runs when it differs from the last one read. `due()` is free: callers on the event loop
    read only when it is true, in a thread. What was read from the database before a change must not be
    cached after it: take `generation` before the read and cache through `keep`."""

    def __init__(self, read: Callable[[], object], on_change: Callable[[], None], every_s: float) -> None:
        self.read, self.on_change, self.every_s = read, on_change, every_s
        self.generation = 0
        self._value: object = None
        self._read_at = -math.inf
        self._lock = threading.Lock()

    def due(self) -> bool:
        return time.monotonic() - self._read_at >= self.every_s

    def check(self) -> None:
        if not self.due():
            return
        read_at = time.monotonic()
        value = self.read()
        with self._lock:
            if value != self._value:
                self.generation += 1
                self.on_change()
                self._value = value
            self._read_at = read_at

    def keep(self, generation: int, put: Callable[[], None]) -> None:
        """Run `put` unless a change was seen since `generation` was taken."""
        with self._lock:
            if self.generation == generation:
                put()


class TTLCache(Generic[K, V]):
    """A small thread-safe LRU whose values expire after `ttl_s` seconds."""

    def __init__(self, maxsize: int, ttl_s: float) -> None:
        self.maxsize, self.ttl_s = maxsize, ttl_s
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[K, threading.Lock] = {}  # keys being computed, one lock each

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] < time.monotonic():
                self._items.pop(key, None)
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = (time.monotonic() + self.ttl_s, value)
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The cached value, or `compute()`'s. Concurrent misses of one key compute it once: when 200
        pods ask a cold server for the same manifest, one request builds it and the others wait for it
        instead of all building it at once (each slower, for the same result)."""
        value = self.get(key)
        if value is not None:
            return value
        with self.computing(key):
            value = self.get(key)
            if value is None:
                value = compute()
                self.put(key, value)
        return value

    @contextmanager
    def computing(self, key: K) -> Iterator[None]:
        """Hold the key's compute lock: one caller at a time computes a value for `key`."""
        with self._lock:
            lock = self._computing.setdefault(key, threading.Lock())
        try:
            with lock:
                yield
        finally:
            with self._lock:
                if self._computing.get(key) is lock and not lock.locked():
                    del self._computing[key]


@dataclass
class Services:
    settings: Settings
    engine: Engine
    queue: TaskQueue
    repository: Repository
    store: BlobStore
    tokens: TokenStore
    plans: TTLCache[str, Plan] = field(default_factory=lambda: TTLCache(1024, 3600.0))
    manifests: TTLCache[tuple[str, str], bytes] = field(default_factory=lambda: TTLCache(4096, 60.0))
    # sha256 of a manifest request body -> the (spec key, toolchain key) it names
    manifest_requests: TTLCache[bytes, tuple[str, str]] = field(
        default_factory=lambda: TTLCache(16384, 3600.0)
    )
    # Verified tokens, briefly: a pull makes many requests. A revocation empties it (`revocations`).
    verified_tokens: TTLCache[str, frozenset[str]] = field(default_factory=lambda: TTLCache(1024, 60.0))
    # The status page's advice per (spec key, toolchain key): seconds to compute, so computed once a while.
    job_advice: TTLCache[tuple[str, str], tuple[Advice | None]] = field(
        default_factory=lambda: TTLCache(256, 600.0)
    )

    # What the service still does before it is ready, while it answers (`warmup serve`): /readyz says it.
    starting: str | None = None

    _stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.revocations = ChangeWatch(
            lambda: self.tokens.revocations(), self.verified_tokens.clear, REVOCATION_CHECK_S
        )
        # Cached manifests may name a blob the store check just found damaged (and whose entries it removed).
        self.damage = ChangeWatch(
            lambda: damaged_blobs(self.engine), self.manifests.clear, REVOCATION_CHECK_S
        )

    @classmethod
    def start(cls, settings: Settings, *, warm_up: bool = True) -> Services:
        """Migrate the database and check the store: a bad URL or bucket fails here, at start-up.
        `warm_up=False` leaves `warm_up()` to the caller (`warmup serve` calls it once it listens)."""
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        url = settings.resolved_database_url
        upgrade(url)
        engine = make_engine(url)
        store = open_store(settings.resolved_store_url, presign_endpoint_url=settings.presign_endpoint_url)
        store.check()
        # A server killed mid-upload left these; the writers of those still locked are alive (other
        # processes sharing the store) and keep them.
        removed = store.remove_stale_uploads()
        if removed.paths:
            log.warning("%s", removed.describe(f"upload temp files in {store.location}"))
        services = cls(
            settings=settings,
            engine=engine,
            queue=TaskQueue(engine),
            repository=Repository(engine),
            store=store,
            tokens=TokenStore(engine),
        )
        # Manifests must outlive neither their presigned URLs nor a garbage collection by long.
        services.manifests.ttl_s = min(60.0, settings.presign_expiry_s / 4)
        if settings.store_check_interval_s:
            services.check_store_every(settings.store_check_interval_s)
        if warm_up:
            services.warm_up()
        return services

    def warm_up(self) -> None:
        """The seconds of importing TRL and torch, spent before the first request that plans (which waits
        for it, warmup/job/trl_args.py)."""
        warm_up_trl()
        _freeze_startup_heap()

    def check_store_every(self, interval_s: float) -> None:
        """A background pass: the store's listing against the blobs entries list (`warmup store check
        --quick`: no blob is read, so every replica may run it), acted on as the command acts."""

        def run() -> None:
            while not self._stopped.wait(interval_s):
                try:
                    found = check_store(self.engine, self.store, read_back=False)
                except Exception as error:  # the database or the store is away: the next pass tries again
                    log.warning("store check: %s: %s", type(error).__name__, error)
                    continue
                for damage in found.damaged:
                    log.warning("store check: damaged: blob %s: %s", damage.sha256, damage.problem)

        threading.Thread(target=run, name="store-check", daemon=True).start()

    def close(self) -> None:
        self._stopped.set()
        self.engine.dispose()

    def plan(self, spec: Spec) -> Plan:
        """The spec's plan, cached by spec key; refuses plans over the configured size."""

        def compute() -> Plan:
            plan = plan_spec(spec)
            if len(plan.signatures) > self.settings.max_signatures:
                raise PlanTooLargeError(
                    f"the spec plans {len(plan.signatures)} signatures, more than this server accepts "
                    f"({self.settings.max_signatures}); pad to a multiple of 128 and bound the lengths",
                    loc="spec.args",
                )
            return plan

        refuse_service_relative_paths(spec)
        return self.plans.get_or_compute(spec.key(), compute)

    def recorded_compile_costs(
        self, toolchain_key: str, backend: str
    ) -> Callable[[list[Signature]], CompileCosts]:
        """Compile seconds recorded under the toolchain for the signatures an advice plans, and the median per
        (model, phase) there for the others."""

        def costs(signatures: list[Signature]) -> CompileCosts:
            keys = list(dict.fromkeys(s.key() for s in signatures))
            models = {s.model for s in signatures}
            samples = [s for s in self.repository.compile_samples(toolchain_key) if s[0] in models]
            recorded = self.repository.compile_seconds(keys, toolchain_key)
            return CompileCosts(backend, recorded, typical_seconds(samples))

        return costs

    def recorded_step_seconds(self, spec: Spec, toolchain_key: str) -> tuple[float | None, str]:
        """The mean steady-state optimizer step of the job of (spec, toolchain), as its training runs reported
        it (WarmupCallback), and a note saying so; (None, "") when no run has reported one."""
        # Any job of the same configuration counts: the data facts change the plan, not the step.
        configured = {**spec.model_dump(mode="json"), "data": None}
        steps, seconds = self.repository.step_timings(
            toolchain_key, lambda document: {**document, "data": None} == configured
        )
        if not steps:
            return None, ""
        return seconds / steps, f"measured: the mean of {steps} step(s) reported by this job's training runs"

    def advice_for_job(self, spec: Spec, toolchain_key: str) -> Advice | None:
        """The status page's advice for a job: from its spec's length histogram (SFT) and the compile seconds
        recorded under its toolchain; None when the spec cannot be advised (no histogram, another trainer)."""

        def compute() -> tuple[Advice | None]:
            if not family(spec.trainer).advised_from_histogram or not spec.data.length_histogram:
                return (None,)
            costs = self.recorded_compile_costs(toolchain_key, spec.target.backend)
            step_seconds, measured_by = self.recorded_step_seconds(spec, toolchain_key)
            try:
                return (
                    advise(
                        spec, compile_costs=costs, step_seconds=step_seconds, step_seconds_from=measured_by
                    ),
                )
            except WarmupError:
                return (None,)  # e.g. packing, or a model config no longer readable: the page shows none

        return self.job_advice.get_or_compute((spec.key(), toolchain_key), compute)[0]

    def pool_toolchain(self, pool: str, world_size: int) -> Toolchain:
        """The toolchain a worker pool registered for jobs of `world_size` processes."""
        found = self.repository.resolve_pool(pool, world_size)
        if found is None:
            scale = f" for jobs of {world_size} processes" if world_size > 1 else ""
            raise SpecError(
                f"no worker of pool {pool!r} has registered{scale} yet; start one with "
                f"`warmup worker --pool {pool}"
                + (
                    " --world-sizes 1,2` (it warms jobs of any number of processes)"
                    if world_size > 1
                    else "`"
                ),
                loc="pool",
            )
        return Toolchain.model_validate(found.data)

    def token_scopes(self, token: str) -> frozenset[str] | None:
        """A token's scopes, None if unknown or revoked. A database read when the token is not cached or
        the revocations are due (`revocations.due()`); run it off the event loop then."""
        self.revocations.check()
        scopes = self.verified_tokens.get(token)
        if scopes is None:
            generation = self.revocations.generation
            scopes = self.tokens.scopes_of(token)
            if scopes is not None:
                verified = scopes
                self.revocations.keep(generation, lambda: self.verified_tokens.put(token, verified))
        return scopes

    def database_ready(self) -> str | None:
        """None when the database answers, else why not."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except Exception as error:
            return f"database: {type(error).__name__}: {str(error).splitlines()[0]}"
        return None

    def store_ready(self) -> str | None:
        try:
            self.store.check()
        except Exception as error:
            return f"store: {error}"
        return None


def refuse_service_relative_paths(spec: Spec) -> None:
    """A relative local path that this service's own working directory holds is refused, not read. The client
    sends every path that exists where it runs as an absolute one, so a relative one is something its machine
    did not have there (or a Hub id): the service's same-named folder would be another model, silently."""
    named = [(f"spec.{key}", getattr(spec, key)) for key in LOCAL_PATH_FIELDS]
    named += [(f"spec.args.{key}", spec.args.get(key)) for key in LOCAL_PATH_ARGS]
    for loc, value in named:
        if not isinstance(value, str) or not value or Path(value).is_absolute():
            continue
        try:
            here = Path(value).exists()
        except (OSError, ValueError):  # a name no filesystem holds: a Hub id, or the reader refuses it
            continue
        if here:
            raise SpecError(
                f"{value} is a relative path, and the service reads none from its own working directory "
                f"({socket.gethostname()}:{os.path.abspath(value)} exists, but it may not be what the client "
                "named): `warmup` sends a path as an absolute one when it exists where the command runs, "
                "so run it in the directory `trl` runs in, or give an absolute path",
                loc=loc,
            )


@functools.cache
def _freeze_startup_heap() -> None:
    """Once per process, with TRL and torch imported: their hundreds of thousands of long-lived objects
    leave the garbage collector's sight, so its full collections stop rescanning them. A request that
    makes many objects (a cold manifest of hundreds of files: thousands of ORM rows) paid for those
    collections (benchmarks/bench_manifests.py measures manifests)."""
    gc.collect()
    gc.freeze()
