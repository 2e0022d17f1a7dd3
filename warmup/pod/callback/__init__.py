"""The training process's watcher: `WarmupCallback` and the coverage report it posts, each module importing only
those after it.

- `observer`: `WarmupCallback`, the transformers TrainerCallback: the hooks that see the signatures a run
  meets, what a compile means (a warning, the strict gate), the report's body (`from warmup import WarmupCallback`).
- `ledger`: the shapes met and the fresh compiles put on each (the backend's counter).
- `strict`: when a run is strict, and the errors that stop it rather than compile an unwarmed graph.
- `report`: the report written beside the run's output, posted to the service, and the verdict line.
- `timings`: where the process's compile time went (torch's timers, the trace skip's bookkeeping), for the
  report, its verdict line and `warmup exec`'s exit line.
"""
