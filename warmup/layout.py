"""The canonical kernel layout: Inductor's C++ kernels keyed by what torch and Python hold, not where.

Inductor keys each C++ kernel by its source together with the compiler command line that builds it
(`CppCodeCache.load_async` hashes `get_hashable_command_line` into the kernel's file name), and that command
line names the folders torch and Python are installed in: `-I<site-packages>/torch/include`,
`-L<site-packages>/torch/lib`, `-I<prefix>/include/python3.11`, `-L<prefix>/lib`. So a cache warmed in one
environment, used from another environment of the same wheels installed elsewhere (a CI image and a training
image, a venv under another prefix), loads every graph and then builds every kernel again with g++.

Under this layout each of those folders is named, in what Inductor hashes (never in what it runs), by a
digest of what it holds:

- torch's package folder by `<torch@sha256:...>`: the digest of torch's own list of its files and their sha256
  (the RECORD pip wrote, which names every file of the wheel, headers and libraries included);
- Python's include folder by `<python-include@sha256:...>`: the digest of every header file in it;
- Python's library folder (`LIBDIR`, only on the command line to find libraries) by `<python-lib@sha256:...>`:
  the digest of the libraries the command line links (`-l`) that it holds (usually none).

Two installs of the same wheels therefore share every kernel key, and two installs whose files differ share
none: a changed header changes the digest, so such a cache misses rather than loads code built against other
files. The same holds for the CPU the kernels are built for: `-march=native` is named by what the compiler
resolves it to here (`<native@sha256:...>`, machine.native_target), so a kernel built for another CPU's
extensions or tuning is never loaded in its stead. A folder whose content cannot be named cheaply (a torch without RECORD, an OpenMP or CUDA folder) stays
in the key as it is: that cache serves only the same location, as before. `install()` puts the layout into
this process (a patch of `torch._inductor.codecache.write`, which computes every kernel's key and path);
warm-up workers, `warmup.activate` and every process `warmup exec` starts call it before anything compiles
(docs/compile-caches.md, "Install locations").

Imports neither torch nor anything heavy at module level: `warmup pull` imports it through the toolchain.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import re
import shlex
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from warmup._compat import torch as compat_torch

# Set (to "1") in the environment of every process that must compile or load kernels under this layout:
# the warm-up's rehearsals and the training processes of `warmup exec` (warmup/pod/_sitecustomize).
ENV_VAR = "WARMUP_KERNEL_LAYOUT"
_MARK = "_warmup_canonical_layout"


@dataclass(frozen=True)
class Location:
    """One folder of Inductor's kernel command line and the token that names its content."""

    folder: str
    token: str


def _digest(lines: list[str]) -> str:
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]


def torch_digest(folder: str) -> str | None:
    """A digest of torch's files and their sha256 from the RECORD of the torch installed in `folder`'s parent
    (the paths are relative to it, so the same wheel gives the same digest anywhere); None without a RECORD."""
    try:
        distribution = next(iter(metadata.distributions(name="torch", path=[str(Path(folder).parent)])))
    except StopIteration:
        return None
    record = distribution.read_text("RECORD")
    if not record:
        return None
    lines = []
    for line in record.splitlines():
        path, _, rest = line.partition(",")
        digest = rest.partition(",")[0]
        if path.startswith("torch/") and digest:  # pip lists the .pyc files it compiled without a hash
            lines.append(f"{path},{digest}")
    return _digest(sorted(lines)) if lines else None


def folder_digest(folder: str) -> str | None:
    """A digest of every file under `folder` (relative path and content); None when it is not a folder."""
    root = Path(folder)
    if not root.is_dir():
        return None
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        lines.append(f"{path.relative_to(root).as_posix()},{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return _digest(lines)


def libraries_digest(folder: str, names: list[str]) -> str:
    """A digest of the libraries among `names` (`-l` names: `torch` is libtorch.so) that `folder` holds."""
    lines = []
    root = Path(folder)
    for name in sorted(set(names)):
        for path in sorted(root.glob(f"lib{name}.so*")) + sorted(root.glob(f"lib{name}.a")):
            if path.is_file():
                lines.append(f"{path.name},{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return _digest(lines)


# The packages whose code runs inside a compiled graph of a TRL job (the model's forward and loss, LoRA layers,
# accelerate's autocast wrapper): where their files are is where a graph's source locations point.
GRAPH_SOURCE_PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate")


def source_folders() -> tuple[str, ...]:
    """The folders (sorted, each once) that GRAPH_SOURCE_PACKAGES are installed in, found without importing
    them. TorchNeuron's NEFF key hashes its graph's IR together with each operation's source location (file
    and line, from the FX node's stack trace): a NEFF cache serves only these folders (source-read, unverified
    on hardware; docs/compile-caches.md, "Install locations")."""
    from importlib.util import find_spec

    folders = set()
    for name in GRAPH_SOURCE_PACKAGES:
        spec = find_spec(name)
        if spec is not None and spec.origin is not None:
            folders.add(os.path.dirname(os.path.dirname(os.path.abspath(spec.origin))))
    return tuple(sorted(folders))


def torch_folder() -> str | None:
    """Where torch is installed, as Inductor names it (the package folder, absolute), without importing it."""
    from importlib.util import find_spec

    spec = find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    return os.path.dirname(os.path.abspath(spec.origin))


@functools.cache
def locations() -> tuple[Location, ...]:
    """The folders of this process's install that the canonical layout names by content, longest first."""
    found: list[Location] = []
    torch = torch_folder()
    if torch is not None and (digest := torch_digest(torch)):
        found.append(Location(torch, f"<torch@{digest}>"))
    includes = {sysconfig.get_path("include"), sysconfig.get_path("include", scheme="posix_prefix")}
    for include in sorted(i for i in includes if i):
        if (digest := folder_digest(include)) is not None:
            found.append(Location(os.path.abspath(include), f"<python-include@{digest}>"))
    libdir = sysconfig.get_config_var("LIBDIR")
    if isinstance(libdir, str) and libdir and os.path.abspath(libdir) not in {f.folder for f in found}:
        libraries = _linked_libraries()
        found.append(Location(os.path.abspath(libdir), f"<python-lib@{libraries_digest(libdir, libraries)}>"))
    return tuple(sorted(found, key=lambda location: len(location.folder), reverse=True))


def canonical(text: str) -> str:
    """`text` with every folder of this process's `locations()` replaced by the token naming its content, and
    every native CPU target by the token naming what it resolves to here."""
    return name_native_targets(rename_folders(text, locations()), _native_token)


# Inductor's flags that leave the CPU to the compiler: `-march=native` (x86, most ARM), `-mcpu=native` (POWER).
_NATIVE = re.compile(r"(-m(?:arch|cpu|tune)=)native(?=[\s'\"]|$)")


def native_flags(command_line: str) -> tuple[str, ...]:
    """The flags of a compiler command line that name this machine's CPU (`-march=native`), each once."""
    return tuple(dict.fromkeys(match.group(0) for match in _NATIVE.finditer(command_line)))


def name_native_targets(text: str, token: Any) -> str:
    """`text` with each native flag's `native` replaced by `token(flag)` (None: left as it is)."""

    def named(match: re.Match[str]) -> str:
        name = token(match.group(0))
        return match.group(1) + name if name else match.group(0)

    return _NATIVE.sub(named, text) if "native" in text else text


@functools.cache
def _native_token(flag: str) -> str | None:
    from warmup import machine

    target = machine.native_target((flag,))
    return f"<native@{_digest(list(target))}>" if target else None


def rename_folders(text: str, found: tuple[Location, ...]) -> str:
    """`text` with each location's folder replaced by its token, where the folder is a whole path or the
    start of one (followed by `/`, a space, a quote or the end): `/usr/lib` is not renamed in `/usr/lib64`."""
    pattern = _pattern(found)
    if pattern is None or not text:
        return text
    tokens = {location.folder: location.token for location in found}
    return pattern.sub(lambda match: tokens[match.group(1)], text)


@functools.cache
def _pattern(found: tuple[Location, ...]) -> re.Pattern[str] | None:
    folders = sorted((location.folder for location in found), key=len, reverse=True)  # the longest first
    if not folders:
        return None
    return re.compile("(" + "|".join(map(re.escape, folders)) + r")(?=[/\s'\"]|$)")


def install(codecache: Any = None) -> None:
    """Make this process's Inductor key its C++ kernels (and every other file it names by a command line)
    under the canonical layout. Idempotent; imports Inductor's code cache unless a stand-in is given."""

    def wrap(original: Any) -> Any:
        def write(content: str | bytes, extension: str, extra: str = "", *args: Any, **kwargs: Any) -> Any:
            return original(content, extension, canonical(extra), *args, **kwargs)

        return write

    compat_torch.wrap_kernel_write(wrap, _MARK, codecache)


def defer_precompiled_headers(codecache: Any = None) -> None:
    """In a training process: Inductor builds its precompiled C++ header only for a kernel it must build.

    The first time a process loads a C++ kernel, built or not, Inductor precompiles the kernels' common
    header (`cpp_prefix.h`: a g++ build of all of torch's kernel headers) into
    `<temp dir>/torchinductor_<user>/precompiled_headers`, under a key of the install folders and of the
    preprocessed header (Inductor does so before it looks for the kernel's library). A pod whose kernels
    all come from the cache builds one it never uses: always in a fresh container, and wherever the temp
    dir, the user or the install differ from the last run. Deferred, a kernel that must still be built
    includes the header as plain text instead (the same code, compiled without the head start); no key
    changes. Idempotent; imports Inductor's code cache unless a stand-in is given."""

    def plain_header(header: str, hashable_cmd_line: str, **compile_command: Any) -> str:
        return _plain_header(header)

    compat_torch.replace_precompiled_header(plain_header, _MARK, codecache)


@functools.cache
def _header_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="trl-warmup-headers-"))  # this process's own (mode 0700)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _plain_header(header: str) -> str:
    """A header file that includes `header` (found through the kernel's -I folders), for `-include`."""
    path = _header_folder() / (hashlib.sha256(header.encode()).hexdigest()[:16] + ".h")
    if not path.is_file():
        path.write_text(f"#include <{header}>\n")
    return str(path)


def command_line_paths() -> tuple[str, ...]:
    """The `-I` / `-L` entries of Inductor's C++ kernel command line here, as this layout hashes them: what
    the toolchain records as `kernel_paths` (equal on two installs of the same files). Imports torch."""
    paths = []
    tokens = shlex.split(canonical(_reference_command_line()))
    for index, token in enumerate(tokens):
        if token in ("-I", "-L") and index + 1 < len(tokens):
            paths.append(token + tokens[index + 1])
        elif token.startswith(("-I", "-L")) and len(token) > 2:
            paths.append(token)
    return tuple(paths)


def command_line_native_flags() -> tuple[str, ...]:
    """The flags of Inductor's C++ kernel command line here that leave the CPU to the compiler: `-march=native`,
    unless `TORCHINDUCTOR_CPP_MARCH` names a target (then none). Imports torch."""
    return native_flags(_reference_command_line(with_isa=False))


def _reference_command_line(*, with_isa: bool = True) -> str:
    """The command line Inductor builds a C++ kernel with here (its hashable form: no source, no output).
    Without the ISA's flags, no ISA is probed (the probes write files, whose keys this layout computes)."""
    return compat_torch.kernel_command_line(with_isa=with_isa)


def _linked_libraries() -> list[str]:
    """The `-l` names of Inductor's kernel command line (torch, torch_cpu, torch_python, gomp on Linux)."""
    try:
        line = _reference_command_line(with_isa=False)
    except ImportError:  # no torch: nothing is linked
        return []
    return [token[2:] for token in shlex.split(line) if token.startswith("-l") and len(token) > 2]
