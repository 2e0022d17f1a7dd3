"""The toolchain: the facts of an environment that must match for a compile cache hit.

A warm-up worker and a training pod each compute their toolchain (`probes.current_toolchain(backend,
device)`; a worker and `warmup submit` through `memo.host_toolchain`, which reads it from the image's memo
when that holds this machine's exact toolchain); the cache built by one is only used by the other when the
two are equal. `key()` names a toolchain (sha256 of its canonical JSON) and `diff()` names the fields that
differ, which is what `ToolchainMismatchError` reports.

- model.py: `Toolchain`, the value, what goes in it and why, and the pure helpers its facts are read with
  (the compile environment, Neuron's flags and generations, package versions);
- probes.py: this process's toolchain computed exactly (`current_toolchain`: torch imported, `torch_key`,
  Inductor's CPU vector ISA probes, the thread count, the Neuron generation);
- memo.py: the same without the expensive work where it can be avoided: the memo of a pod's cache directory
  and the image's (`warmup toolchain --remember`), read from the facts warmup/machine.py gives without torch
  (`resolve_toolchain`, `host_toolchain`, `remembered_toolchain`).

Training pods import this package: no module of it imports torch (or anything heavy) at module level;
probes.py imports torch inside its functions.
"""
