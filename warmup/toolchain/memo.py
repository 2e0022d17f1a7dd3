"""The toolchain without the expensive work where it can be avoided (`resolve_toolchain`): the memo a pull
leaves in a pod's cache directory, and the image's memo (`warmup toolchain --remember`), which holds the exact
toolchains computed with this install by the facts they depend on, read without torch (warmup/machine.py),
and predicts another machine's from them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Literal

from warmup.toolchain.model import Toolchain, compile_env, package_version
from warmup.toolchain.probes import current_toolchain, isa_table

# Where a pod's cache directory remembers the toolchain its pull used (see `remembered_toolchain`).
TOOLCHAIN_MEMO = ".warmup-toolchain.json"
# The image's memo: the exact toolchains computed with this install, by the facts they depend on.
IMAGE_MEMO_ENV = "WARMUP_TOOLCHAIN_MEMO"
# 2: toolchains carry kernel_paths, and an install's facts its location; 3: kernel_paths name content, and
# toolchains carry the compiler (an install's facts its identity); 4: toolchains carry cpu_target, a machine's
# facts what -march=native resolves to, an install's the native flags of Inductor's command line
IMAGE_MEMO_FORMAT = 4
# The fields of a toolchain fixed by the installed software; the others describe the machine.
BUILD_FIELDS = (
    "backend",
    "device",
    "python",
    "torch",
    "torch_key",
    "transformers",
    "trl",
    "accelerate",
    "triton",
    "torch_neuronx",
    "neuronx_cc",
    "cuda",
    "kernel_paths",
    "cxx",
    "source_dirs",
    "env",
)
ToolchainSource = Literal["remembered", "exact", "predicted", "computed"]


def host_toolchain(backend: str, device: str, *, world_size: int = 1) -> Toolchain:
    """This host's exact toolchain, for a worker (or `warmup submit`) that labels what it asks for or
    uploads with it: `resolve_toolchain` without a pod's cache directory and never `predicted`. From the
    image's memo it costs no torch import (a worker starts in about a second instead of ten)."""
    return resolve_toolchain(backend, device, world_size=world_size, exact_only=True)[0]


def remembered_toolchain(
    backend: str,
    device: str,
    *,
    world_size: int = 1,
    directory: str | os.PathLike[str] | None = None,
    remember: bool = True,
) -> Toolchain:
    """This machine's toolchain without the expensive work where it can be avoided (`resolve_toolchain`)."""
    return resolve_toolchain(backend, device, world_size=world_size, directory=directory, remember=remember)[
        0
    ]


def resolve_toolchain(
    backend: str,
    device: str,
    *,
    world_size: int = 1,
    directory: str | os.PathLike[str] | None = None,
    remember: bool = True,
    exact_only: bool = False,
) -> tuple[Toolchain, ToolchainSource]:
    """`current_toolchain`, from memory when what it is made of has not changed, and how it was found.

    Computing a toolchain imports torch, hashes torch's sources and builds Inductor's ISA probes with
    g++, seconds a pod would pay before every training start. In order:
    - `remembered`: the memo in `directory` (the cache dir an earlier pull filled), when the facts it
      was computed under are all unchanged;
    - `exact`: the image's memo (`image_memo_path`), computed with this install on a machine like this
      one (same CPU flags, core count, compiler, GPUs, environment);
    - `predicted`: the image's memo knows this install but not this machine: the software facts come
      from it and the machine's (CPU vector ISA, threads, GPU model) are read from the kernel and the
      driver, the CPU target from the compiler driver (warmup/machine.py). The training process computes the exact facts as it starts and
      refuses a cache pulled for facts that were wrong (warmup.pod.activation.verify_pulled_toolchain);
    - `computed`: nothing remembered applies: computed, and remembered in the image's memo when it can
      be written (so that `warmup toolchain --remember` in an image build makes every pod fast).
    The facts are read without importing torch: torch's RECORD (the sha256 of every installed file),
    package versions, the interpreter, the CPU's flags and physical cores, what `-march=native` resolves
    to (the compiler driver's answer, which compiles nothing), the compiler, the GPUs, and the
    compile-relevant environment. Neuron toolchains (instance facts from the runtime) are
    always computed. With `remember=False` nothing is written into `directory` (a pull writes it once
    it has succeeded: `remember_toolchain`). With `exact_only`, a `predicted` answer is computed instead.
    """
    if device == "neuron":
        return current_toolchain(backend, device, world_size=world_size), "computed"
    build, machine = cheap_facts(backend, device, world_size)
    facts = {"build": build, "machine": machine}
    memo = Path(directory) / TOOLCHAIN_MEMO if directory is not None else None
    if memo is not None:
        try:
            data = json.loads(memo.read_text())
            if data.get("facts") == facts:
                return Toolchain.model_validate(data["toolchain"]), "remembered"
        except (OSError, ValueError, KeyError, TypeError):
            pass
    found = image_memo_toolchain(build, machine, world_size)
    if found is not None and not (exact_only and found[1] == "predicted"):
        toolchain, source = found
    else:
        toolchain, source = current_toolchain(backend, device, world_size=world_size), "computed"
        remember_in_image(toolchain, world_size=world_size)
    if remember and memo is not None and memo.parent.is_dir():  # never create a dir
        _write_memo(memo, facts, toolchain)
    return toolchain, source


def remember_toolchain(
    directory: str | os.PathLike[str], toolchain: Toolchain, *, world_size: int = 1
) -> None:
    """Write the memo `resolve_toolchain` reads in `directory` (once a pull has created it)."""
    if toolchain.device != "neuron":
        build, machine = cheap_facts(toolchain.backend, toolchain.device, world_size)
        _write_memo(Path(directory) / TOOLCHAIN_MEMO, {"build": build, "machine": machine}, toolchain)


def _write_memo(memo: Path, facts: dict[str, Any], toolchain: Toolchain) -> None:
    _write_json(memo, {"facts": facts, "toolchain": toolchain.model_dump(mode="json")})


def _write_json(path: Path, document: dict[str, Any]) -> None:
    # A fresh temp file (mkstemp: O_EXCL, so a symlink planted at a predictable name is not followed).
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(json.dumps(document, sort_keys=True))
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def cheap_facts(backend: str, device: str, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a toolchain depends on, read without importing torch: the installed software's facts (the
    interpreter, package versions, torch's build, the compile environment) and the machine's."""
    import sys

    from warmup import machine

    packages = (
        "torch",
        "transformers",
        "trl",
        "accelerate",
        "triton",
        "pytorch-triton",
        "torch-neuronx",
        "neuronx-cc",
    )
    build = {
        "backend": backend,
        "device": device,
        "python": [os.path.realpath(sys.executable), platform.python_version()],
        "packages": {name: package_version(name) for name in packages},
        "torch_build": machine.torch_record_sha256() or _torch_sources_stat(),
        # Where this install is: what the memo remembers is this install's (kernel_paths are not the same
        # elsewhere when a folder cannot be named by its content).
        "torch_dir": str(machine.torch_package_dir()),
        "compiler": machine.compiler_identity() if device == "cpu" else None,
        "env": compile_env(),
    }
    machine_facts = {
        "world_size": world_size,
        "arch": platform.machine(),
        # on CPU what the compiler makes of -march=native here (a few ms): another CPU target is another machine
        # (a list, as it reads back from a memo's JSON)
        "cpu": [
            machine.cpu_model(),
            sorted(machine.cpu_flags()),
            list(machine.native_target() or ()) if device == "cpu" else None,
        ],
        "cores": [machine.physical_cores(), os.cpu_count()],
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": {
            name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_RANK")
        },
        "gpus": [machine.gpu_models(), machine.nvidia_driver(), os.environ.get("CUDA_VISIBLE_DEVICES")],
    }
    return build, machine_facts


def _torch_sources_stat() -> str | None:
    """The size and mtime of every torch source file (what `torch_key` hashes), for a torch that pip
    did not install (no RECORD): slower to read (a walk of torch's tree), as exact for a pod."""
    from warmup import machine

    folder = machine.torch_package_dir()
    if folder is None:
        return None
    sources = hashlib.sha256()
    for parent, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(parent, name))
                sources.update(f"{parent}/{name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return sources.hexdigest()


def _facts_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def image_memo_path(*, for_writing: bool = False) -> Path | None:
    """The image's toolchain memo: WARMUP_TOOLCHAIN_MEMO, else `<prefix>/share/trl-warmup/toolchain.json`
    of this interpreter's environment (the image: written when the image is built), else the user's
    cache (~/.cache/trl-warmup). For reading, the first that exists; for writing, the first whose
    folder can be written (None: nowhere)."""
    import sys

    explicit = os.environ.get(IMAGE_MEMO_ENV)
    if explicit:
        return Path(explicit)
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    candidates = [
        Path(sys.prefix) / "share" / "trl-warmup" / "toolchain.json",
        cache_home / "trl-warmup" / "toolchain.json",
    ]
    for candidate in candidates:
        if not for_writing and candidate.is_file():
            return candidate
        if for_writing and _writable_folder(candidate.parent):
            return candidate
    return None


def image_isa_probes(memo: Path) -> Path:
    """Where the image keeps Inductor's CPU ISA probe programs, built when `warmup toolchain --remember`
    computed its toolchain. Inductor keys each by the compiler's version, the ISA's flags and torch's
    version (its own design, so that a process need not build them again: torch/_inductor/cpu_vec_isa.py),
    and builds one only when it is missing; `warmup pull` / `warmup exec` copy them into a pod's cache
    directory so that its training process does not spend seconds of g++ on them at its first compile."""
    return memo.with_name(memo.name + ".isa-probes")


def _writable_folder(folder: Path) -> bool:
    existing = folder
    while not existing.exists():
        existing = existing.parent
    return existing.is_dir() and os.access(existing, os.W_OK)


def _read_image_memo(path: Path | None) -> dict[str, Any]:
    empty: dict[str, Any] = {"format": IMAGE_MEMO_FORMAT, "builds": {}, "exact": {}}
    if path is None:
        return empty
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return empty
    if not isinstance(data, dict) or data.get("format") != IMAGE_MEMO_FORMAT:
        return empty
    for part in ("builds", "exact"):
        if not isinstance(data.get(part), dict):
            data[part] = {}
    return data


def image_memo_toolchain(
    build: dict[str, Any], machine_facts: dict[str, Any], world_size: int
) -> tuple[Toolchain, ToolchainSource] | None:
    """The toolchain the image's memo gives for these facts: exact for a machine it has seen, else
    predicted from the software facts it holds and this machine's kernel and driver; None when it
    does not know this install (or cannot predict this machine)."""
    from warmup import machine

    memo = _read_image_memo(image_memo_path())
    build_key = _facts_key(build)
    machines = memo["exact"].get(build_key)
    exact = machines.get(_facts_key(machine_facts)) if isinstance(machines, dict) else None
    if exact is not None:
        try:
            return Toolchain.model_validate(exact), "exact"
        except ValueError:
            pass
    known = memo["builds"].get(build_key)
    if not isinstance(known, dict):
        return None
    facts = dict(known.get("facts") or {})
    device = facts.get("device")
    if device == "cpu":
        table = [(str(name), [str(f) for f in needed]) for name, needed in known.get("isa_table") or []]
        native = tuple(str(flag) for flag in known.get("native_flags") or ())
        facts.update(
            device_kind="cpu",
            cpu_isa=machine.predicted_cpu_isa(table),
            cpu_target=machine.native_target(native) if native else None,
            num_threads=machine.predicted_threads(world_size),
        )
        if (
            facts["cpu_isa"] is None
            or facts["num_threads"] is None
            or (native and facts["cpu_target"] is None)
        ):
            return None
    elif device == "cuda":
        facts["device_kind"] = machine.predicted_gpu_name()
        if facts["device_kind"] is None:
            return None
    else:
        return None
    try:
        return Toolchain.model_validate(facts), "predicted"
    except ValueError:
        return None


def remember_in_image(toolchain: Toolchain, *, world_size: int = 1) -> Path | None:
    """Remember `toolchain`, computed exactly in this process, in the image's memo: its software facts
    under the install's facts, and the whole of it under the install's and this machine's. Inductor's
    CPU ISA candidates (each with the kernel flags it needs) go with it, so that another machine's
    ISA can be predicted. Entries of the same install whose software facts differ from these were
    stale (a torch changed in place, a memo copied from another image): they are dropped. Returns the
    memo's path, or None when no memo can be written here. So do the flags of Inductor's kernel command line
    that leave the CPU to the compiler (`-march=native`), so that another machine's target can be resolved."""
    if toolchain.device == "neuron":
        return None
    path = image_memo_path(for_writing=True)
    if path is None:
        return None
    build, machine_facts = cheap_facts(toolchain.backend, toolchain.device, world_size)
    document = toolchain.model_dump(mode="json")
    entry: dict[str, Any] = {"facts": {name: document[name] for name in BUILD_FIELDS}}
    if toolchain.device == "cpu":
        from warmup import layout

        entry["isa_table"] = isa_table()
        entry["native_flags"] = list(layout.command_line_native_flags())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        memo = _read_image_memo(path)
        build_key = _facts_key(build)
        memo["builds"][build_key] = entry
        machines = memo["exact"].get(build_key)
        machines = machines if isinstance(machines, dict) else {}
        machines = {
            key: other
            for key, other in machines.items()
            if isinstance(other, dict) and all(other.get(name) == document[name] for name in BUILD_FIELDS)
        }
        machines[_facts_key(machine_facts)] = document
        memo["exact"][build_key] = machines
        _write_json(path, memo)
    except OSError:
        return None
    return path
