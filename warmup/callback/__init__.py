"""The training process's watcher: `WarmupCallback` and the coverage report it posts.

- `observer`: `WarmupCallback`, the transformers TrainerCallback: the signatures a run meets, the compiles they
  cost, the strict gate and the coverage report (`from warmup import WarmupCallback`).
- `timings`: where the process's compile time went (torch's timers, the trace skip's bookkeeping), for the
  report, its verdict line and `warmup exec`'s exit line.
"""
