"""Facts about this machine and its installed packages, read cheaply: no torch import, no compiler run.

A pod's `warmup pull` needs its toolchain before it can ask for the manifest; computing it exactly
imports torch (seconds), hashes every torch source (`torch_key`) and builds Inductor's ISA probe
programs with g++ (seconds more). What the toolchain depends on can be read far more cheaply:

- the torch build: pip writes the sha256 of every installed file into the distribution's RECORD,
  so one small file read names the exact build (`torch_record_sha256`);
- the CPU's vector extensions from what the kernel reports (`/proc/cpuinfo` flags), and its
  physical core count (what torch sizes its thread pool from) from sysfs;
- the GPUs' model names from the NVIDIA driver (`/proc/driver/nvidia/gpus/*/information`);
- what `-march=native` on Inductor's kernel command line builds for here (`native_target`): the compiler
  driver prints the options it would hand its compiler proper (`-###`: nothing is compiled, a few ms).

`warmup/toolchain/memo.py` remembers the exact facts once per image under a key of these, and predicts the
machine-dependent ones (ISA, threads, GPU) from them on a machine it has not seen; the training
process computes the exact facts anyway and refuses a cache whose toolchain does not match them.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import platform
import shlex
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def torch_record_sha256() -> str | None:
    """sha256 of torch's installed RECORD (the sha256 of every file of the build), or None when torch
    is not installed or has no RECORD (an install pip did not make)."""
    try:
        distribution = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    record = distribution.read_text("RECORD")
    if not record:
        return None
    return hashlib.sha256(f"{distribution.version}\n{record}".encode()).hexdigest()


def torch_package_dir() -> Path | None:
    """Where torch is installed, found without importing it."""
    from importlib.util import find_spec

    spec = find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def cpu_flags() -> frozenset[str]:
    """The CPU features the kernel reports (`flags` on x86, `Features` on ARM) for the first CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name":
            return value.strip()
    return platform.processor()


def physical_cores() -> int | None:
    """Physical cores of the whole machine (not the affinity mask), as torch's default thread pool
    counts them: distinct (package, core) pairs of the online CPUs."""
    cores: set[tuple[str, str]] = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        topology = cpu / "topology"
        try:
            cores.add(
                (
                    (topology / "physical_package_id").read_text().strip(),
                    (topology / "core_id").read_text().strip(),
                )
            )
        except OSError:
            continue
    return len(cores) or None


def predicted_threads(world_size: int) -> int | None:
    """torch.get_num_threads() of a training process of a job of `world_size` processes, predicted:
    under torchrun each rank gets OMP_NUM_THREADS (1 when unset); alone, OMP_NUM_THREADS, else
    MKL_NUM_THREADS, else the physical core count. None when a variable cannot be read as a count."""
    if world_size > 1 and "LOCAL_RANK" not in os.environ:
        return _count(os.environ.get("OMP_NUM_THREADS") or "1")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(name)
        if value:
            return _count(value)
    return physical_cores()


def _count(text: str) -> int | None:
    try:
        value = int(text.split(",")[0])
    except ValueError:
        return None
    return value if value > 0 else None


def cxx() -> str:
    """The C++ compiler Inductor runs: CXX, else g++ (its `cpp.cxx` default on Linux)."""
    return os.environ.get("CXX") or "g++"


def compiler_identity() -> str:
    """The C++ compiler Inductor would run (CXX, else g++ on PATH): path, size and mtime. Its ISA
    probes depend on what this compiler supports."""
    name = cxx()
    path = shutil.which(name)
    if path is None:
        return f"{name}: not found"
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
    except OSError:
        return real
    return f"{real}:{stat.st_size}:{stat.st_mtime_ns}"


def compiler_version() -> str | None:
    """The first line of `--version` of the C++ compiler Inductor would run (CXX, else g++), or None when
    there is none: which compiler built a kernel (its runtime libraries must be there to load it)."""
    return _compiler_version(cxx(), compiler_identity())


@functools.cache
def _compiler_version(compiler: str, identity: str) -> str | None:
    """Asked once per process for each compiler file (`identity`: its path, size and mtime)."""
    done = _ask_compiler(compiler, "--version")
    lines = done.stdout.strip().splitlines() if done else []
    return lines[0].strip() if lines else None


def _ask_compiler(compiler: str, *args: str) -> subprocess.CompletedProcess[str] | None:
    """`compiler` run with `args` in the C locale, or None when it cannot run or fails."""
    try:
        done = subprocess.run(
            [compiler, *args], capture_output=True, text=True, timeout=30, env={**os.environ, "LC_ALL": "C"}
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done if done.returncode == 0 else None


# The flag Inductor's C++ kernel command line names this machine's CPU with on x86 and most ARM machines
# (`cpp_builder._get_cpu_arch_cflags`); the toolchain reads the flags it really uses from the command line.
NATIVE_FLAGS = ("-march=native",)


def native_target(flags: tuple[str, ...] = NATIVE_FLAGS) -> tuple[str, ...] | None:
    """What the C++ compiler (`cxx()`) generates code for here when given `flags` (`-march=native`): the
    target CPU, the tuning, every instruction-set extension it enables and the cache sizes it tunes for,
    as `target_of` normalises them. The driver resolves `native` from the CPU (cpuid on x86) and prints
    the options it would hand its compiler proper under `-###`, which runs nothing (and no `-o` or `-E`: a
    compiler wrapper that caches or logs builds sees a query). None when there is no such compiler or it
    refuses the flags."""
    return _native_target(cxx(), tuple(flags))


@functools.cache
def _native_target(compiler: str, flags: tuple[str, ...]) -> tuple[str, ...] | None:
    done = _ask_compiler(compiler, *flags, "-###", "-fsyntax-only", "-x", "c++", os.devnull)
    return target_of(done.stderr) if done else None


def target_of(driver_output: str) -> tuple[str, ...] | None:
    """The options that decide which CPU code is generated for, from a compiler driver's `-###` (or `-v`)
    output: the compiler proper's command line (gcc's `cc1plus` / `cc1`, clang's `-cc1`). Kept: the CPU
    (`-march=`, `-mcpu=`), the tuning (`-mtune=`), each extension enabled (`-m<extension>`) and each
    `--param` (the cache sizes gcc reads from the CPU); in gcc's spelling (clang's `-target-cpu X` as
    `-march=X`, `-tune-cpu X` as `-mtune=X`, `-target-feature +X` as `-mX`). The extensions turned off
    (`-mno-...`) are left out: with the same compiler (the toolchain's `cxx`) they are all it checks for
    less those enabled. Sorted, each once. None when no such command line is found."""
    for line in driver_output.splitlines():
        try:
            tokens = shlex.split(line)
        except ValueError:
            continue
        if not tokens:
            continue
        if os.path.basename(tokens[0]) in ("cc1plus", "cc1"):
            return _gcc_target(tokens[1:])
        if tokens[1:2] == ["-cc1"]:
            return _clang_target(tokens[2:])
    return None


def _gcc_target(tokens: list[str]) -> tuple[str, ...]:
    kept = set()
    for index, token in enumerate(tokens):
        if token == "--param" and index + 1 < len(tokens):
            kept.add(f"--param={tokens[index + 1]}")
        elif token.startswith("--param=") or (token.startswith("-m") and not token.startswith("-mno-")):
            kept.add(token)
    return tuple(sorted(kept))


def _clang_target(tokens: list[str]) -> tuple[str, ...]:
    spelled = {"-target-cpu": "-march=", "-tune-cpu": "-mtune="}
    kept = set()
    for option, value in itertools.pairwise(tokens):
        if option in spelled:
            kept.add(spelled[option] + value)
        elif option == "-target-feature" and value.startswith("+"):
            kept.add("-m" + value[1:])
    return tuple(sorted(kept))


# Inductor's x86 compiler flags -> the names the kernel reports the same features under.
_KERNEL_NAMES = {"avx512vnni": "avx512_vnni"}


def kernel_flags_of(arch_flags: str) -> list[str]:
    """The kernel's names for the features a compiler flag string enables (`-mavx2 -mfma` -> avx2, fma)."""
    names = []
    for flag in arch_flags.split():
        if flag.startswith("-m") and not flag.startswith(("-march", "-mtune", "-msve")):
            name = flag[2:].replace("-", "_")
            names.append(_KERNEL_NAMES.get(name, name))
    return names


def predicted_cpu_isa(table: list[tuple[str, list[str]]], flags: frozenset[str] | None = None) -> str | None:
    """The vector ISA Inductor picks here, predicted: the first entry of `table` (Inductor's candidates
    in its order of preference, each with the kernel flags it needs) whose flags the kernel reports.
    None when the table is empty or names no ISA this CPU has (then it is computed)."""
    flags = cpu_flags() if flags is None else flags
    for name, needed in table:
        if needed and all(flag in flags for flag in needed):
            return name
    return None


def gpu_models() -> list[str]:
    """The model name of each GPU the NVIDIA driver knows, in bus order."""
    models = []
    for information in sorted(NVIDIA_GPUS.glob("*/information")):
        try:
            text = information.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "Model":
                models.append(value.strip())
    return models


def gpu_driver_present() -> bool:
    """Whether a GPU driver is loaded here (NVIDIA's, or AMD's ROCm): without one, torch sees no GPU."""
    return any(path.exists() for path in (NVIDIA_GPUS.parent, Path("/dev/nvidiactl"), Path("/dev/kfd")))


def predicted_gpu_name() -> str | None:
    """torch.cuda.get_device_name() of the first visible GPU, predicted from the driver: the one model
    name when every GPU of the machine is the same model, else None (computed, not guessed)."""
    models = set(gpu_models())
    if len(models) != 1 or os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return None
    return models.pop()


def nvidia_driver() -> str | None:
    try:
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return None
