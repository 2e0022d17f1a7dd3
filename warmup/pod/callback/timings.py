"""Where a training process's compile time went, from torch's own timers and the trace skip's bookkeeping: the
coverage report's `details.timings` and its verdict line, and the line `warmup exec`'s processes end with when
no WarmupCallback said its verdict."""

from __future__ import annotations

import sys
import time
from typing import Any

from warmup._compat import torch as compat_torch
from warmup.trace_skip.serve import active


def exit_line() -> None:
    """Where the process's compile time went and how many graphs Inductor compiled afresh (its cache misses),
    unless a WarmupCallback's verdict, which counts new cache files too, already said it (and so stays the
    last line of the run)."""
    if _VERDICT_SAID:
        return
    from warmup.backends.inductor import MISS_COUNTERS

    counters = compat_torch.dynamo_counters()
    fresh = sum(int(counters[group][name]) for group, name in MISS_COUNTERS) if counters is not None else 0
    timings = describe_timings(compile_timings(timed_first_step()))
    print(f"trl-warmup: {timings}; {fresh} fresh compile(s) (Inductor cache misses)", file=sys.stderr)


_VERDICT_SAID: list[bool] = []


def verdict_said() -> None:
    """A WarmupCallback printed its verdict (with these timings) in this process: no exit line after it."""
    _VERDICT_SAID.append(True)


_FIRST_STEP: list[float] = []  # this process's first training step, in seconds (`first_step_clock`)


def first_step_clock() -> Any:
    """A TrainerCallback timing the process's first training step, for `warmup exec`'s exit line (its
    sitecustomize gives one to every Trainer; `WarmupCallback` times its own)."""
    from transformers import TrainerCallback

    class FirstStepClock(TrainerCallback):
        started: float | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.started is None:
                self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.started is not None and not _FIRST_STEP:
                _FIRST_STEP.append(time.perf_counter() - self.started)

    return FirstStepClock()


def timed_first_step() -> float | None:
    """The first training step's seconds in this process, once a `first_step_clock` has timed it."""
    return _FIRST_STEP[0] if _FIRST_STEP else None


def compile_timings(first_step_s: float | None = None) -> dict[str, Any]:
    """Where this process's compile time went, from torch's own timers: Dynamo's trace (its frames, less
    the backend inside them), the backend (AOTAutograd and Inductor, or their cache loads, backwards
    included), the trace artifacts' loading, and the calls they served."""
    spent = compat_torch.dynamo_time_spent()
    frames, backend = spent.get("entire_frame_compile", 0.0), spent.get("backend_compile", 0.0)
    state = active()
    timings: dict[str, Any] = {
        "trace_s": round(max(frames - backend, 0.0), 3),
        "backend_s": round(backend + spent.get("entire_backward_compile", 0.0), 3),
        "cache_load_s": round(state.load_seconds, 3) if state else 0.0,
        "served_untraced": state.hits if state else 0,
        "traced": state.misses if state else None,
    }
    if state is not None and state.off is not None:
        timings["trace_skip_off"] = state.off
    if state is not None and state.refused:
        timings["trace_refused"] = dict(state.refused)
    if first_step_s is not None:
        timings["first_step_s"] = round(first_step_s, 3)
    return timings


def describe_timings(timings: dict[str, Any]) -> str:
    text = (
        f"trace {timings['trace_s']:.1f} s, backend {timings['backend_s']:.1f} s, "
        f"cache load {timings['cache_load_s']:.1f} s"
    )
    if "first_step_s" in timings:
        text += f", first step {timings['first_step_s']:.1f} s"
    state = active()
    return text + (f"; {state.describe()}" if state else "")
