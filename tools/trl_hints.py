"""Build warmup/data/trl_hints.json: what became of config fields that TRL and transformers no longer have.

A config written for an older TRL or transformers names fields that `trl <trainer> --config` now refuses
(`max_seq_length`, `evaluation_strategy`, `torch_dtype`, ...). TRL and transformers said what replaced
each one in their own deprecation messages, in the releases before the field went. This script reads
those messages from the sources of every release it is given, with the field lists of each config
dataclass, and writes one entry per field that some release had:

    {"scope": "SFTConfig", "field": "max_seq_length", "replacement": "max_length",
     "message": "`max_seq_length` is deprecated and will be removed in version 0.20.0. Use `max_length` instead.",
     "first_deprecated": "trl v0.16.0", "last_seen": "trl v0.19.1"}

`warmup.job.trl_config` reads the file to answer a refused field with TRL's own words and the fix.

Sources (nothing is downloaded by this script):
- a git clone of huggingface/trl: every release tag from v0.10 on (`--trl-repo`);
- the installed TRL (the newest release, which the clone may predate);
- wheels of transformers (`--transformers-wheel`, e.g. `pip download --no-deps transformers==4.45.2`),
  and the installed transformers.

    python tools/trl_hints.py --trl-repo /path/to/trl \\
        --transformers-wheel transformers-4.45.2-py3-none-any.whl ... > warmup/data/trl_hints.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

TRL_FILES = re.compile(r"^trl/(trainer/[a-z_]*config\.py|scripts/utils\.py)$")
TRANSFORMERS_FILES = ("transformers/training_args.py",)
# "`name` is deprecated", "`name` argument is deprecated", "using `name` is deprecated"
SUBJECT = re.compile(r"`-*(\w+)`(?: argument| parameter)? (?:is|are) deprecated")
REPLACEMENT = re.compile(
    r"(?:[Uu]se|in favor of|replaced by|[Pp]lease use|set) `-*(\w+)`(?:=\S+)? instead"
    r"|(?:in favor of|replaced by) `-*(\w+)`"
    r"|[Uu]se `-*(\w+)` instead"
)


def release_key(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", tag)[:3])


def trl_releases(repo: Path) -> Iterator[tuple[str, dict[str, str]]]:
    tags = subprocess.run(
        ["git", "-C", str(repo), "tag"], capture_output=True, text=True, check=True
    ).stdout.split()
    tags = sorted(
        (t for t in tags if re.fullmatch(r"v\d+\.\d+(\.\d+)?", t) and release_key(t) >= (0, 10)),
        key=release_key,
    )
    for tag in tags:
        names = subprocess.run(
            ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        files = {}
        for name in names:
            if TRL_FILES.match(name):
                files[name] = subprocess.run(
                    ["git", "-C", str(repo), "show", f"{tag}:{name}"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
        yield f"trl {tag}", files


def installed_trl() -> tuple[str, dict[str, str]]:
    import trl

    root = Path(trl.__file__).parent
    files = {}
    for path in root.rglob("*.py"):
        name = "trl/" + path.relative_to(root).as_posix()
        if TRL_FILES.match(name):
            files[name] = path.read_text()
    return f"trl v{trl.__version__}", files


def transformers_wheel(path: Path) -> tuple[str, dict[str, str]]:
    version = re.search(r"transformers-([\d.]+)", path.name)
    with zipfile.ZipFile(path) as wheel:
        return f"transformers v{version.group(1) if version else '?'}", {
            name: wheel.read(name).decode() for name in TRANSFORMERS_FILES
        }


def installed_transformers() -> tuple[str, dict[str, str]]:
    import transformers

    root = Path(transformers.__file__).parent
    return f"transformers v{transformers.__version__}", {
        name: (root / name.removeprefix("transformers/")).read_text() for name in TRANSFORMERS_FILES
    }


def strings_in(node: ast.AST) -> Iterator[str]:
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child.value
        elif isinstance(child, ast.JoinedStr):  # f-strings: their literal parts, placeholders as {}
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in child.values)


def classes(source: str) -> Iterator[tuple[str, set[str], list[tuple[str | None, str]]]]:
    """(class name, its fields, its deprecation messages with the field each names) of each dataclass-like class."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        fields: set[str] = set()
        messages: list[tuple[str | None, str]] = []
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                fields.add(item.target.id)
                for text in strings_in(item.value) if item.value is not None else ():
                    if "deprecated" in text.lower():
                        messages.append((item.target.id, text))
            elif isinstance(item, ast.FunctionDef):
                for text in strings_in(item):
                    if "deprecated" in text.lower():
                        messages.append((None, text))
        if fields:
            yield node.name, fields, messages


def clean(text: str) -> str:
    return " ".join(text.split())


def build(releases: list[tuple[str, dict[str, str]]]) -> list[dict]:
    entries: dict[tuple[str, str], dict] = {}
    latest: dict[str, set[str]] = {}  # fields of each class in the newest release that has the class
    for release, files in releases:
        for source in files.values():
            for scope, fields, messages in classes(source):
                latest[scope] = fields
                for name in fields:
                    entry = entries.setdefault((scope, name), {"scope": scope, "field": name})
                    entry["last_seen"] = release
                for named, text in messages:
                    subject = SUBJECT.search(text)
                    field = subject.group(1) if subject else named
                    if field is None or field not in fields:
                        continue
                    entry = entries[(scope, field)]
                    found = REPLACEMENT.search(text)
                    replacement = next((g for g in found.groups() if g), None) if found else None
                    if replacement == field:
                        replacement = None
                    if "message" not in entry or (replacement and not entry.get("replacement")):
                        entry["message"] = clean(text)
                        entry["replacement"] = replacement
                        entry.setdefault("first_deprecated", release)
    # Keep what a refused field can be answered with: fields gone from their class, or deprecated.
    kept = [
        e
        for (scope, name), e in sorted(entries.items())
        if name not in latest.get(scope, set()) or "message" in e
    ]
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trl-repo", type=Path, required=True, help="a git clone of huggingface/trl with its tags"
    )
    parser.add_argument(
        "--transformers-wheel", type=Path, nargs="*", default=[], help="older transformers wheels"
    )
    ns = parser.parse_args(argv)
    trl_sources = [*trl_releases(ns.trl_repo), installed_trl()]
    wheels = sorted((transformers_wheel(w) for w in ns.transformers_wheel), key=lambda r: release_key(r[0]))
    transformers_sources = [*wheels, installed_transformers()]
    entries = build(transformers_sources) + build(trl_sources)
    json.dump(
        {
            "about": "Config fields of past TRL / transformers releases and their deprecation messages; "
            "built by tools/trl_hints.py from the releases listed in `sources`.",
            "sources": [name for name, _ in transformers_sources + trl_sources],
            "entries": entries,
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
