"""docs/architecture.md's picture of the package names every module and folder the package has, and no other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "warmup"


def _picture() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers and what may import what", 1)[1]
    return section.split("```", 2)[1]


def _named_at_top(picture: str) -> set[str]:
    """The entries the picture lists at the package's top level: a name at the start of a line, after three
    spaces (`   store.py  ...`, `   job/  ...`, `   +-- api/  ...` under the command line), or a line that lists
    several (`   manifest.py, errors.py`)."""
    names: set[str] = set()
    for line in picture.splitlines():
        match = re.match(r"^ {3}(?:\+-- )?(\S.*?)(?: {2,}|$)", line)
        if match and match.group(1)[0] not in "-|(":
            names.update(name.strip() for name in match.group(1).split(","))
    return names


def _in_tree() -> set[str]:
    entries = set()
    for path in PACKAGE.iterdir():
        if path.name in {"__init__.py", "__main__.py", "__pycache__", "cli"}:
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            entries.add(f"{path.name}/")
        elif path.suffix == ".py":
            entries.add(path.name)
        elif path.is_dir() and path.name == "data":
            entries.add("data/")
    return entries


def test_the_architecture_picture_names_each_top_level_module_and_folder_of_the_package() -> None:
    picture = _picture()
    named = _named_at_top(picture)
    tree = _in_tree()
    assert tree - named == set(), (
        f"in warmup/ but not in docs/architecture.md's picture: {sorted(tree - named)}"
    )
    assert named - tree == set(), (
        f"in docs/architecture.md's picture but not in warmup/: {sorted(named - tree)}"
    )


def test_the_architecture_picture_names_each_module_of_the_job_and_pod_packages() -> None:
    picture = _picture()
    for package in ("job", "pod"):
        for path in (PACKAGE / package).iterdir():
            if path.name in {"__init__.py", "__pycache__"}:
                continue
            name = f"{path.name}/" if path.is_dir() else path.name
            assert name in picture, f"warmup/{package}/{name} is not in docs/architecture.md's picture"
