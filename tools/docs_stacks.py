"""mkdocs hook (mkdocs.yml `hooks:`): docs/compatibility.md's tables of the tested stacks, rendered at every build
from warmup/data/stacks.json (what CI's runs recorded: tools/stack_record.py), in place of its `<!-- stacks -->`
line, so that the page says what the last recorded runs showed and nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

STACKS = Path(__file__).resolve().parents[1] / "warmup" / "data" / "stacks.json"
MARKER = "<!-- stacks -->"
PACKAGES = (
    "python",
    "torch",
    "transformers",
    "accelerate",
    "trl",
    "peft",
    "datasets",
    "deepspeed",
    "kernels",
)
FEATURES = ("plan", "zero compiles", "relocation", "trace skip", "sharded jobs", "unit tier")


def _result(stack: dict[str, Any], feature: str) -> str:
    if stack.get("whole_suite"):
        return "holds (the whole suite)"
    counts = stack["features"].get(feature)
    if not counts:
        return "not run"
    verdict = "holds" if counts["failed"] == 0 and counts["passed"] else "FAILS"
    return f"{verdict} ({counts['passed']} passed, {counts['failed']} failed)"


def tables() -> str:
    stacks = json.loads(STACKS.read_text())["stacks"]
    names = list(stacks)
    head = "| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    versions = "".join(
        f"| {package} | " + " | ".join(stacks[n]["versions"].get(package, "-") for n in names) + " |\n"
        for package in PACKAGES
    )
    command = "| run by | " + " | ".join(f"`{stacks[n]['command']}`" for n in names) + " |\n"
    recorded = "| recorded | " + " | ".join(stacks[n].get("recorded", "every CI run") for n in names) + " |\n"
    features = "".join(
        f"| {feature} | " + " | ".join(_result(stacks[n], feature) for n in names) + " |\n"
        for feature in FEATURES
    )
    return f"{head}{versions}{command}{recorded}\n{head}{features}"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == "compatibility.md":
        return markdown.replace(MARKER, tables())
    return markdown
