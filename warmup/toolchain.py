"""The toolchain: the facts of an environment that must match for a compile cache hit.

A warm-up worker and a training pod each compute their toolchain with `current_toolchain(backend,
device)` (a worker and `warmup submit` through `host_toolchain`, which reads it from the image's memo when
that holds this machine's exact toolchain); the cache built by one is only used by the other when the two
are equal. `key()` names a toolchain (sha256 of its canonical JSON) and `diff()` names the fields that
differ, which is what `ToolchainMismatchError` reports.

What goes in, and why (docs/compile-caches.md, sections 2-4):
- torch version and `torch_key` (a hash of every torch source file: Inductor's keys contain it);
- transformers, trl, accelerate: they decide which graphs a trainer produces;
- Python version: not in Inductor's key, but in Dynamo's precompile checks and in pickled entries;
- triton, CUDA version and GPU name on CUDA;
- on CPU, the vector ISA Inductor picks and the thread count: the ISA is NOT in Inductor's key, and a
  cache built for AVX-512 silently gives wrong numbers under AVX2; what `-march=native` on the kernels'
  command line resolves to (the CPU, tuning and extensions the kernels are built for: Inductor's key holds
  the literal flag); the compiler that built the kernels; and the folders on the kernels' command line,
  named by content where warmup/layout.py can (another install of the same wheels has the same toolchain);
- on Neuron, torch-neuronx and neuronx-cc versions (the NEFF key leaves them out), the instance
  family (trn1 / trn2 / trn3), the logical NeuronCore config (LNC) and the canonical NEURON_CC_FLAGS;
- environment variables that change compiled code (TORCHINDUCTOR_*, TORCH_COMPILE_*, ...), but not
  cache-dir paths (they differ per machine and are not in any key) nor the variables trl-warmup sets
  itself through `warmup.activate` (both sides set them the same way).

This module is imported by training pods: it must not import torch (or anything heavy) at module
level. torch is imported inside `current_toolchain` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import tempfile
import threading
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from warmup._compat import torch as compat_torch
from warmup.errors import BackendUnavailableError, SpecError, ToolchainMismatchError

Backend = Literal["neuron", "inductor"]
Device = Literal["neuron", "cuda", "cpu"]

# Environment variables whose value can change compiled code, by prefix or exact name.
COMPILE_ENV_PREFIXES = (
    "TORCHINDUCTOR_",
    "TORCH_COMPILE_",
    "TORCH_DYNAMO_",
    "TORCHDYNAMO_",
    "ACCELERATE_DYNAMO_",
    "TORCH_NEURONX_",
    "NEURON_COMPILER_",
    "NEURON_CC_",
    "XLA_FLAGS",
)
COMPILE_ENV_NAMES = frozenset(
    {"CXX", "ATEN_CPU_CAPABILITY", "NEURON_FUSE_SOFTMAX", "NEURON_RT_STOCHASTIC_ROUNDING_EN"}
)

# Left out on purpose: cache locations, logging, compile parallelism (not in any key), and the
# variables that warmup.activate sets on both sides (they would only record the order of calls).
IGNORED_ENV_NAMES = frozenset(
    {
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCHINDUCTOR_COMPILE_THREADS",
        "TORCHINDUCTOR_WORKER_START",
        "TORCHINDUCTOR_WORKER_SUPPRESS_LOGGING",
        "TORCHINDUCTOR_FX_GRAPH_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
        "TORCH_COMPILE_CACHE_KEY_TAG",
        "TORCH_COMPILE_DEBUG",
        "TORCH_COMPILE_JOB_ID",
        "ACCELERATE_DYNAMO_USE_DYNAMIC",
        "TORCH_NEURONX_NEFF_CACHE_DIR",
        "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
        "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT",
        "TORCH_NEURONX_DEBUG_DIR",
        "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS",
        "NEURON_CC_FLAGS",  # kept, canonicalised, in `compiler_flags`
        "NEURON_COMPILE_CACHE_URL",
    }
)
IGNORED_ENV_SUFFIXES = ("_CACHE_DIR", "_CACHE_URL", "_LOG", "_LOGS", "_VERBOSE", "_DEBUG_DIR")

# `accelerate launch` (and so `trl <kind>`) exports its dynamo settings to every process it starts, at these
# values when not asked otherwise; accelerate's TorchDynamoPlugin reads exactly these values when they are
# absent, so a variable at its default is the same as unset (and a worker, not started by a launcher, has none).
_FALSE_WORDS = frozenset({"false", "0", "no", "n", "f", "off"})  # accelerate's str_to_bool
DEFAULT_ENV_VALUES: dict[str, frozenset[str]] = {
    "ACCELERATE_DYNAMO_BACKEND": frozenset({"no"}),
    "ACCELERATE_DYNAMO_MODE": frozenset({"default"}),
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": _FALSE_WORDS,
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": _FALSE_WORDS,
}

# Compiler flags that name a location or the log level: they change no compiled graph.
NEURON_CC_IGNORED_FLAGS = frozenset({"--cache_dir", "--cache-dir", "--verbose", "--logfile", "--log-file"})

# The NeuronCore config each Trainium generation defaults to (trn1 only supports LNC=1).
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}


def _only_what_differs(ours: Any, theirs: Any) -> tuple[Any, Any]:
    """Of two lists (kernel_paths), the items each has that the other lacks (the whole lists when they hold
    the same items in another order); other values whole."""
    if isinstance(ours, list) and isinstance(theirs, list):
        only_ours, only_theirs = [i for i in ours if i not in theirs], [i for i in theirs if i not in ours]
        if only_ours or only_theirs:
            return only_ours, only_theirs
    return ours, theirs


class Toolchain(BaseModel):
    """The fingerprint of an environment, as far as compiled artifacts are concerned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Backend
    device: Device
    python: str = Field(description="Python version, e.g. 3.11.7.")
    torch: str = Field(description="torch.__version__.")
    torch_key: str = Field(description="Inductor's hash of every torch source file (hex).")
    transformers: str | None = None
    trl: str | None = None
    accelerate: str | None = None
    triton: str | None = None
    torch_neuronx: str | None = None
    neuronx_cc: str | None = None
    device_kind: str = Field(description="cpu, the GPU name, or the Trainium generation (trn1, trn2, trn3).")
    cpu_isa: str | None = Field(None, description="CPU: the vector ISA Inductor generates code for.")
    cpu_target: tuple[str, ...] | None = Field(
        None,
        description="CPU: what `-march=native` on Inductor's C++ kernel command line makes the compiler build "
        "for here: the CPU and tuning (`-march=`, `-mtune=`), each instruction-set extension enabled (`-m...`) "
        "and the cache sizes (`--param=`), sorted (warmup/machine.py `native_target`). None when the command "
        "line names no native target (TORCHINDUCTOR_CPP_MARCH set).",
    )
    num_threads: int | None = Field(
        None, description="CPU: torch.get_num_threads() (in Inductor's key since 2.13)."
    )
    kernel_paths: tuple[str, ...] | None = Field(
        None,
        description="CPU: the -I / -L directories of Inductor's C++ kernel command line, which is in every "
        "kernel's key, as the canonical kernel layout names them: torch's and Python's folders by the digest of "
        "their content (`<torch@sha256:...>/include`), any other folder by its path (warmup/layout.py).",
    )
    cxx: str | None = Field(
        None, description="CPU: the C++ compiler Inductor builds kernels with (`--version`'s first line)."
    )
    cuda: str | None = Field(None, description="CUDA: torch.version.cuda.")
    source_dirs: tuple[str, ...] | None = Field(
        None,
        description="Neuron: the folders torch, transformers and the other packages whose code runs in a "
        "compiled graph are installed in: TorchNeuron's NEFF key hashes the graph's IR with each operation's "
        "source location (file and line), so a NEFF cache serves only these folders (source-read, unverified).",
    )
    neuron_lnc: int | None = Field(None, description="Neuron: logical NeuronCore config (1 or 2).")
    compiler_flags: str | None = Field(None, description="Neuron: NEURON_CC_FLAGS, tokenised and sorted.")
    env: dict[str, str] = Field(default_factory=dict, description="Compile-relevant environment variables.")

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """sha256 of the canonical JSON: equal toolchains have equal keys, in any process."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def diff(self, other: Toolchain) -> dict[str, tuple[Any, Any]]:
        """Fields that differ, as {field: (ours, theirs)}; environment variables as `env.NAME`."""
        ours, theirs = self.model_dump(mode="json"), other.model_dump(mode="json")
        differences: dict[str, tuple[Any, Any]] = {}
        for field in type(self).model_fields:
            if field == "env":
                continue
            if ours[field] != theirs[field]:
                differences[field] = _only_what_differs(ours[field], theirs[field])
        for name in sorted(set(self.env) | set(other.env)):
            if self.env.get(name) != other.env.get(name):
                differences[f"env.{name}"] = (self.env.get(name), other.env.get(name))
        return differences

    def require_same(self, other: Toolchain, *, what: str = "toolchain") -> None:
        """Raise ToolchainMismatchError naming every differing field unless `other` equals this one."""
        differences = self.diff(other)
        if differences:
            raise ToolchainMismatchError(differences, what=what)

    @property
    def short(self) -> str:
        """One line for logs and tables, e.g. `inductor/cpu avx512 x2 torch 2.13.0+cpu`."""
        detail = {
            "cpu": f"{self.cpu_isa} x{self.num_threads}",
            "cuda": f"{self.device_kind} cuda {self.cuda}",
            "neuron": f"{self.device_kind} lnc={self.neuron_lnc}",
        }[self.device]
        return f"{self.backend}/{self.device} {detail} torch {self.torch}"


# --- pure helpers (no torch) ------------------------------------------------------------------------


def canonical_neuron_cc_flags(flags: str | None) -> str:
    """NEURON_CC_FLAGS in one canonical form: `--flag value` joined as `--flag=value`, sorted.

    TorchNeuron and the XLA stack hash the raw flag string, so `--a --b` and `--b --a` (or `--x 1` and
    `--x=1`) compile the same graph under different keys; setting the canonical form on both sides
    makes them agree. Location and logging flags (`--cache_dir`, `--verbose`, ...) are dropped.
    """
    try:
        tokens = shlex.split(flags or "")
    except ValueError as error:
        raise SpecError(f"NEURON_CC_FLAGS cannot be parsed ({error}): quote it like a shell would") from None
    joined: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.startswith("-") and "=" not in token and following is not None and not _is_flag(following):
            token = f"{token}={following}"
            index += 1
        joined.append(token)
        index += 1
    kept = [token for token in joined if token.split("=", 1)[0] not in NEURON_CC_IGNORED_FLAGS]
    return " ".join(sorted(kept))


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", token)


def compile_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The compile-relevant environment variables of `environ` (default: this process), sorted."""
    environ = os.environ if environ is None else environ
    selected = {}
    for name, value in environ.items():
        relevant = name in COMPILE_ENV_NAMES or name.startswith(COMPILE_ENV_PREFIXES)
        if not relevant or name in IGNORED_ENV_NAMES or name.endswith(IGNORED_ENV_SUFFIXES):
            continue
        if value.strip().lower() in DEFAULT_ENV_VALUES.get(name, ()):
            continue
        selected[name] = value
    return dict(sorted(selected.items()))


def neuron_target_from_name(name: str | None) -> str | None:
    """trn1 / trn2 / trn3 from an instance type (`trn2.48xlarge`) or a device name (`Trainium2`, `trn2`)."""
    if not name:
        return None
    text = name.strip().lower()
    match = re.search(r"\btrn(\d)", text) or re.search(r"trainium(\d)?", text)
    if not match:
        return None
    generation = match.group(1) or "1"
    return f"trn{generation}"


def neuron_lnc(target: str | None, environ: Mapping[str, str] | None = None) -> int:
    """The logical NeuronCore config: NEURON_LOGICAL_NC_CONFIG, else the generation's default."""
    environ = os.environ if environ is None else environ
    raw = environ.get("NEURON_LOGICAL_NC_CONFIG")
    if raw is not None and raw.strip():
        if raw.strip() not in ("1", "2"):
            raise SpecError(f"NEURON_LOGICAL_NC_CONFIG is {raw!r}; only 1 and 2 are valid (trn2/trn3)")
        value = int(raw)
        if target == "trn1" and value != 1:
            raise SpecError("NEURON_LOGICAL_NC_CONFIG must be 1 on trn1 (only trn2/trn3 support LNC=2)")
        return value
    return DEFAULT_LNC.get(target or "", 1)


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None; never imports it."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# --- the environment this process runs in -------------------------------------------------------


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


def prepare_current_toolchain(device: str) -> None:
    """Import what `current_toolchain` imports, so that it can then run in a thread beside other work
    (two threads importing at once can meet a module the other has half imported)."""
    from warmup import layout, machine  # noqa: F401

    try:
        import torch  # noqa: F401  (its import, which the threads must not race)

        if device != "neuron":
            compat_torch.import_kernel_builders()
    except ImportError:
        pass  # current_toolchain says what is missing


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
      refuses a cache pulled for facts that were wrong (warmup.activation.verify_pulled_toolchain);
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
