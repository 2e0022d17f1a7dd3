"""This process's toolchain, computed exactly (`current_toolchain`): torch imported (here only, inside the
functions), `torch_key` hashed, Inductor's CPU vector ISA probes built with g++ side by side, the thread count
a training process gets, the Neuron generation. Seconds: warmup/toolchain/memo.py avoids them where it can.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmup._compat import torch as compat_torch
from warmup.errors import BackendUnavailableError, SpecError
from warmup.toolchain.model import (
    Toolchain,
    canonical_neuron_cc_flags,
    compile_env,
    neuron_lnc,
    neuron_target_from_name,
    package_version,
)


def current_toolchain(backend: str, device: str, *, world_size: int = 1) -> Toolchain:
    """This machine's toolchain for `backend` on `device`, as seen by a job of `world_size` processes.

    Raises BackendUnavailableError when this machine cannot run that combination (no GPU, no
    torch-neuronx, ...). Imports torch.
    """
    _check_pair(backend, device)
    try:
        import torch

        compat_torch.codecache()  # imported here: the threads below must not both import it
    except ImportError:
        raise BackendUnavailableError(
            "computing a toolchain needs torch: pip install 'trl-warmup[trl]' (or the training image's torch)"
        ) from None
    # On CPU, Inductor's ISA probes (g++ builds: seconds) run while torch_key hashes torch's sources.
    torch_key = compat_torch.torch_key
    hashed_torch, isa = side_by_side([torch_key, cpu_vec_isa]) if device == "cpu" else (torch_key(), None)
    facts: dict[str, Any] = {
        "backend": backend,
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_key": hashed_torch.hex(),
        "transformers": package_version("transformers"),
        "trl": package_version("trl"),
        "accelerate": package_version("accelerate"),
        "triton": package_version("triton") or package_version("pytorch-triton"),
        "torch_neuronx": package_version("torch-neuronx"),
        "neuronx_cc": package_version("neuronx-cc"),
        "env": compile_env(),
    }
    if device == "cpu":
        from warmup import layout, machine

        native = layout.command_line_native_flags()
        facts.update(
            device_kind="cpu",
            cpu_isa=isa,
            cpu_target=machine.native_target(native) if native else None,
            num_threads=training_threads(world_size),
            kernel_paths=layout.command_line_paths(),
            cxx=machine.compiler_version(),
        )
    elif device == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                "the target device is cuda but torch sees no GPU here: run on a GPU machine, "
                "or target device: cpu"
            )
        facts.update(
            device_kind=torch.cuda.get_device_name(torch.cuda.current_device()), cuda=torch.version.cuda
        )
    else:
        from warmup import layout

        target = _neuron_target()
        facts.update(
            device_kind=target,
            neuron_lnc=neuron_lnc(target),
            compiler_flags=canonical_neuron_cc_flags(os.environ.get("NEURON_CC_FLAGS")),
            source_dirs=layout.source_folders(),
        )
    return Toolchain(**facts)


def prepare_current_toolchain(device: str) -> None:
    """Import what `current_toolchain` imports, so that it can then run in a thread beside other work
    (two threads importing at once can meet a module the other has half imported)."""
    from warmup import machine  # noqa: F401

    try:
        import torch  # noqa: F401  (its import, which the threads must not race)

        if device != "neuron":
            compat_torch.import_kernel_builders()
    except ImportError:
        pass  # current_toolchain says what is missing


def isa_table() -> list[tuple[str, list[str]]]:
    """Inductor's x86 vector ISA candidates, in its order of preference, each with the kernel flags
    (/proc/cpuinfo) its compiler flags need; empty off x86 (there the ISA is always computed)."""
    from warmup.machine import kernel_flags_of

    table = []
    for isa, arch_flags in compat_torch.vec_isa_candidates():
        flags = kernel_flags_of(arch_flags)
        if flags:
            table.append((str(isa), flags))
    return table


def training_threads(world_size: int) -> int:
    """The thread count torch uses in each training process of a job of `world_size` processes.

    Inside a process this is torch.get_num_threads(). Outside (a warm-up CLI or a pod's `warmup pull`
    before `torchrun`), several ranks each get OMP_NUM_THREADS, which torchrun sets to 1 when unset.
    """
    import torch

    if world_size > 1 and "LOCAL_RANK" not in os.environ:
        return int(os.environ.get("OMP_NUM_THREADS") or 1)
    threads: int = torch.get_num_threads()
    return threads


def cpu_vec_isa() -> str:
    """The vector ISA Inductor's C++ backend generates code for on this CPU (e.g. `avx512 avx512_vnni`).

    Inductor decides each candidate ISA by building small probe programs with g++, one after the other:
    about ten builds of a second each on an AMX machine, the bulk of a pod's `warmup pull`. Each candidate
    caches its answer, so all of this CPU's candidates are asked at once first (the builds are subprocesses:
    threads run them side by side), leaving Inductor's pick only cached answers to read."""
    compat_torch.probe_vec_isas(side_by_side)
    return compat_torch.vec_isa()


def side_by_side(calls: list[Callable[[], Any]]) -> list[Any]:
    """Call each of `calls` in a thread of its own (the first in this one) and return their results in
    order, raising the first error. For work that overlaps: subprocesses, hashing in C. A toolchain may
    be computed at interpreter exit (the callback's last report, from atexit), where executors take no
    new work and newer Pythons start no threads: a call whose thread cannot start runs here instead."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as error:
            errors[index] = error

    threads = []
    for index in range(1, len(calls)):
        thread = threading.Thread(target=run, args=(index,), name="warmup-side-by-side", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # the interpreter is shutting down
            run(index)
            continue
        threads.append(thread)
    if calls:
        run(0)
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


def _check_pair(backend: str, device: str) -> None:
    if backend not in ("neuron", "inductor"):
        raise SpecError(f"unknown backend {backend!r}: expected neuron or inductor", loc="target.backend")
    if device not in ("neuron", "cuda", "cpu"):
        raise SpecError(f"unknown device {device!r}: expected neuron, cuda or cpu", loc="target.device")
    if (backend == "neuron") != (device == "neuron"):
        raise SpecError(
            f"backend {backend!r} does not run on device {device!r}: "
            "neuron runs on neuron, inductor on cuda or cpu",
            loc="target",
        )


def _neuron_target() -> str:
    """The Trainium generation of this machine; BackendUnavailableError without torch-neuronx."""
    if package_version("torch-neuronx") is None:
        raise BackendUnavailableError(
            "the target backend is neuron but torch-neuronx is not installed here: run on a Trainium "
            "instance with the Neuron SDK (pip install 'trl-warmup[neuron]'); for a job that trains on GPUs or CPUs, "
            "give its target: --target cuda or --target cpu (or `target:` in the side file). Neuron is the default "
            "target unless the config says use_cpu: true"
        )
    override = neuron_target_from_name(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"))
    if override:
        return override
    try:
        import torch

        name = torch.neuron.get_device_properties(0).name
        found = neuron_target_from_name(name)
        if found:
            return found
    except Exception:  # no device visible, or an older torch-neuronx: fall back to the instance type
        pass
    product = Path("/sys/devices/virtual/dmi/id/product_name")
    found = neuron_target_from_name(product.read_text() if product.is_file() else None)
    if found:
        return found
    raise BackendUnavailableError(
        "cannot tell the Trainium generation of this machine: "
        "set NEURON_PLATFORM_TARGET_OVERRIDE=trn2 (or trn1/trn3)"
    )
