"""Another install of the same wheels, under another prefix: what a second image of the same packages is.

`repack(names, wheelhouse)` turns distributions installed in this environment back into wheels (their files
as RECORD lists them, without the `.pyc` files pip compiled and the console scripts it generated: pip makes
those again on install). `new_install(prefix, wheels)` makes a fresh virtual environment at `prefix` from
this interpreter and installs those wheels into it with pip, offline (`--no-index`): the same bytes at
another place, installed the way pip installs any wheel. `closure(["trl-warmup[trl]"])` names the
distributions a requirement pulls in, as installed here. `build_wheel(folder)` builds this checkout's wheel
from a copy of its files, so that tests building it at once do not share setuptools' `build/` folder.

Only the standard library, `packaging` and pip: the tests and benchmarks/relocation_factors.py use it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# What pip writes on install (or that says how it installed): made again by the installing pip.
INSTALLER_FILES = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


def closure(requirements: Iterable[str]) -> list[str]:
    """The installed distributions `requirements` need, transitively (themselves included), extras and
    markers evaluated here: canonical names, sorted."""
    seen: dict[str, set[str]] = {}
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in seen and extras <= seen[name]:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency this environment does not have
        seen.setdefault(name, set()).update(extras)
        for text in distribution.requires or []:
            needed = Requirement(text)
            if needed.marker is None or any(
                needed.marker.evaluate({"extra": extra}) for extra in (seen[name] or {""})
            ):
                todo.append(needed)
    return sorted(seen)


def repack(names: Iterable[str], wheelhouse: Path) -> list[Path]:
    """A wheel in `wheelhouse` for each installed distribution of `names` (editable installs are refused)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    return [_repack_one(metadata.distribution(name), wheelhouse) for name in names]


def _repack_one(distribution: metadata.Distribution, wheelhouse: Path) -> Path:
    direct_url = json.loads(distribution.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        raise ValueError(
            f"{distribution.metadata['Name']} is an editable install: it has no wheel to rebuild"
        )
    info = Path(str(distribution._path))  # type: ignore[attr-defined]  # the .dist-info folder
    site = info.parent
    tags = [
        line.split(":", 1)[1].strip()
        for line in (distribution.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    name = distribution.metadata["Name"].replace("-", "_")
    version = distribution.version
    wheel = wheelhouse / f"{name}-{version}-{_compressed_tag(tags or ['py3-none-any'])}.whl"
    scripts = {
        entry.name for entry in distribution.entry_points if entry.group in ("console_scripts", "gui_scripts")
    }
    data = f"{name}-{version}.data"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for row in csv.reader(io.StringIO(distribution.read_text("RECORD") or "")):
            if not row:
                continue
            relative = row[0]
            source = (site / relative).resolve() if relative.startswith("..") else site / relative
            parts = Path(relative).parts
            if "__pycache__" in parts or relative.endswith(".pyc") or not source.is_file():
                continue
            if parts[0] == info.name and parts[-1] in INSTALLER_FILES:
                continue
            if relative.startswith(".."):  # outside site-packages: a script or data under the prefix
                under_prefix = Path(*parts[3:])  # ../../../bin/x -> bin/x
                if under_prefix.parts[0] == "bin":
                    if under_prefix.name in scripts:
                        continue  # pip writes console scripts itself, for the new interpreter
                    arcname = f"{data}/scripts/{under_prefix.name}"
                else:
                    arcname = f"{data}/data/{under_prefix.as_posix()}"
            else:
                arcname = relative
            content = source.read_bytes()
            archive.writestr(arcname, content)
            record.append((arcname, _record_hash(content), str(len(content))))
        record_name = f"{info.name}/RECORD"
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*record, (record_name, "", "")])
        archive.writestr(record_name, text.getvalue())
    return wheel


def _compressed_tag(tags: list[str]) -> str:
    """The file name's tag of a wheel whose WHEEL lists `tags` (`py2-none-any`, `py3-none-any` -> `py2.py3-none-any`)."""
    parts = [tag.split("-") for tag in tags]
    return "-".join(".".join(dict.fromkeys(part[i] for part in parts)) for i in range(3))


def _record_hash(content: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def new_install(prefix: Path, wheels: Iterable[Path], *, base_python: Path | None = None) -> Path:
    """A new virtual environment at `prefix` (from `base_python`, by default this interpreter's base Python)
    with `wheels` installed by pip, offline and without dependency resolution (the wheels are the whole set).
    Returns its python. pip does not byte-compile here: the first import compiles what it uses, as a
    `--no-compile` image would."""
    creator = str(base_python or sys.executable)
    subprocess.run([creator, "-m", "venv", "--without-pip", str(prefix)], check=True)
    python = prefix / "bin" / "python"
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    command += ["--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check"]
    subprocess.run([*command, *map(str, wheels)], check=True)
    return python


def with_changed_file(wheel: Path, member: str, appended: bytes, folder: Path) -> Path:
    """A copy of `wheel` in `folder` whose file `member` has `appended` at its end, its RECORD updated to
    match: another build of the same version (the same name, version and Python files)."""
    folder.mkdir(parents=True, exist_ok=True)
    changed = folder / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(changed, "w", zipfile.ZIP_STORED) as target:
        record_name = next(name for name in source.namelist() if name.endswith(".dist-info/RECORD"))
        content = source.read(member) + appended
        for info in source.infolist():
            if info.filename == record_name:
                continue
            target.writestr(info, content if info.filename == member else source.read(info.filename))
        rows = list(csv.reader(io.StringIO(source.read(record_name).decode())))
        rows = [
            [member, _record_hash(content), str(len(content))] if row and row[0] == member else row
            for row in rows
        ]
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        target.writestr(record_name, text.getvalue())
    return changed


# What a build of the checkout does not need: environments, caches, and at its top, the outputs of earlier builds
# and runs (`data/` there is a service's state; `warmup/data/` is the package's own).
ANYWHERE = shutil.ignore_patterns(".git", ".venv*", "*.egg-info", "__pycache__", ".*_cache", "node_modules")
AT_THE_TOP = {"build", "dist", "site", "data"}


def _not_built_from(root: Path) -> Callable[[str, list[str]], set[str]]:
    def ignored(folder: str, names: list[str]) -> set[str]:
        return set(ANYWHERE(folder, names)) | (AT_THE_TOP & set(names) if Path(folder) == root else set())

    return ignored


def build_wheel(folder: Path, root: Path | None = None) -> Path:
    """This checkout's wheel, built (no dependencies, no build isolation) in `folder` from a copy of the
    checkout's files: setuptools writes `build/` into the tree it builds, and two builds of one tree at once
    (two xdist workers) break each other's ("Directory not empty") or pack each other's half-written files."""
    root = root or Path(__file__).resolve().parents[2]
    source = folder / "source"
    shutil.copytree(root, source, symlinks=True, ignore=_not_built_from(root))
    wheels = folder / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*pip_wheel, "--wheel-dir", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel of {root} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (built,) = wheels.glob("trl_warmup-*.whl")
    return built
