"""The toolchain's value: `Toolchain`, the facts of an environment that must match for a compile cache hit,
and the pure helpers (no torch) those facts are read with.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from importlib import metadata
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from warmup.errors import SpecError, ToolchainMismatchError

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
