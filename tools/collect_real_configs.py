"""Copy real `trl <trainer> --config` files, as found, from git clones into tests/real_configs/.

Each file is written byte for byte as its repository has it (a documentation block: the block's lines),
and tests/real_configs/PROVENANCE.yaml records its repository, commit, path (and lines), license and the
trainer it is for. Nothing is edited: tests/unit/planner/test_real_configs.py points the model path at a tiny
model itself, in a copy.

    python tools/collect_real_configs.py --trl /path/to/trl --handbook /path/to/alignment-handbook \\
        --open-r1 /path/to/open-r1
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "tests" / "real_configs"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def license_of(repo: Path, commit: str) -> str:
    text = git(repo, "show", f"{commit}:LICENSE")
    return (
        "Apache-2.0" if "Apache License" in text and "Version 2.0" in text else text.splitlines()[0].strip()
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trl", type=Path, required=True)
    parser.add_argument("--handbook", type=Path, required=True)
    parser.add_argument("--open-r1", type=Path, required=True)
    ns = parser.parse_args()
    entries = []

    def add(repo: Path, name: str, path: str, text: str, trainer: str, lines: str | None = None) -> None:
        commit = git(repo, "rev-parse", "HEAD").strip()
        stem = path.replace("/", "-").removesuffix(".yaml").removesuffix(".md")
        file = f"{name.split('/')[1]}/{stem}{'-L' + lines.split('-')[0] if lines else ''}.yaml"
        (OUT / file).parent.mkdir(parents=True, exist_ok=True)
        (OUT / file).write_text(text)
        entry = {"file": file, "repository": name, "commit": commit, "path": path}
        if lines:
            entry["lines"] = lines
        entry.update(license=license_of(repo, commit), trainer=trainer)
        entries.append(entry)

    # TRL's CLI documentation: every ```yaml block that is a trl config (the first line names it: `# sft_config.yaml`)
    doc = "docs/source/clis.md"
    lines = git(ns.trl, "show", f"HEAD:{doc}").splitlines(keepends=True)
    start = None
    for number, line in enumerate(lines, 1):
        if line.strip() == "```yaml":
            start = number + 1
        elif line.strip() == "```" and start is not None:
            block = "".join(lines[start - 1 : number - 1])
            found = re.match(r"# (\w+)_config\.yaml", block)
            if found and "model_name_or_path" in block:
                add(ns.trl, "huggingface/trl", doc, block, found.group(1), f"{start}-{number - 1}")
            start = None
    add(
        ns.trl,
        "huggingface/trl",
        "examples/cli_configs/example_config.yaml",
        git(ns.trl, "show", "HEAD:examples/cli_configs/example_config.yaml"),
        "sft",
    )

    for repo, name in ((ns.handbook, "huggingface/alignment-handbook"), (ns.open_r1, "huggingface/open-r1")):
        for path in git(repo, "ls-tree", "-r", "--name-only", "HEAD").split():
            if not path.endswith(".yaml") or not path.startswith(("recipes/", "tests/fixtures/")):
                continue
            text = git(repo, "show", f"HEAD:{path}")
            data = yaml.safe_load(text)
            kind = next(
                (p for p in path.split("/") if p in ("sft", "dpo", "grpo", "orpo", "kto", "rloo")), None
            )
            if kind is None and "fixtures/config_" in path:
                kind = path.split("config_")[1].split("_")[0]
            if not isinstance(data, dict) or "model_name_or_path" not in data or kind is None:
                continue  # accelerate configs, dataset filtering (not trl training configs)
            add(repo, name, path, text, kind)

    (OUT / "PROVENANCE.yaml").write_text(
        "# Real trl configs, copied as found by tools/collect_real_configs.py; one entry per file.\n"
        + yaml.safe_dump({"configs": entries}, sort_keys=False, width=120)
    )
    print(f"{len(entries)} configs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
