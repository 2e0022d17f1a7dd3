"""The training process's watcher: `WarmupCallback` and the coverage report it posts, each module importing only
those after it.

- `observer`: `WarmupCallback`, the transformers TrainerCallback: the signatures a run meets and the fresh
  compiles each cost, the strict gate's checks, the report's body (`from warmup import WarmupCallback`).
- `strict`: when a run is strict, and the errors that stop it rather than compile an unwarmed graph.
- `report`: the report written beside the run's output, posted to the service, and the verdict line.
- `timings`: where the process's compile time went (torch's timers, the trace skip's bookkeeping), for the
  report, its verdict line and `warmup exec`'s exit line.
"""
