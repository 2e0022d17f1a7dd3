"""Code and docs cite only what is in the repository: design facts live in docs/, and every docs/ page named exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Built from parts so that this file does not match itself.
OUTSIDE = re.compile("|".join(["shared" + "/notes", "DESIGN" + r"\.md", r"/work/" + "shared"]))
DOCS_PAGE = re.compile(r"docs/([\w-]+\.md)")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".sh", ".sbatch", ".html", ".mako"}


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    paths = [REPO / name for name in listed]
    return [p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name.endswith("Dockerfile"))]


def test_no_file_cites_notes_outside_the_repository():
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in _tracked_text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == [], "cite a docs/ page instead: " + ", ".join(offenders)


def test_every_docs_page_cited_exists():
    missing = sorted(
        {
            f"{path.relative_to(REPO)} -> docs/{page}"
            for path in _tracked_text_files()
            for page in DOCS_PAGE.findall(path.read_text(errors="replace"))
            if not (REPO / "docs" / page).is_file()
        }
    )
    assert missing == []
