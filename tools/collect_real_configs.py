"""Copy real `trl <trainer> --config` files, as found, from git clones into tests/real_configs/.

Each file is written byte for byte as its repository has it (a documentation block: the block's lines),
and tests/real_configs/PROVENANCE.yaml records its repository, commit, path (and lines), license and the
trainer it is for. Nothing is edited: tests/unit/planner/test_real_configs.py points the model path at a tiny
model itself, in a copy.

Command lines are real configs too: a training script's docstring (TRL's trl/scripts and examples/scripts), a
course page or a shell recipe runs `trl <trainer> --k v`, `python script.py --k v` or `accelerate launch
[--launch options] script.py --k v`; written out as the YAML a user would pass to `trl <trainer> --config`, each
`--k v` becomes `k: v` (the value as YAML reads it; a bare flag `true`; several values a list), accelerate's
launch options included (they are launch keys of a trl config), torchrun's left out (not `trl`'s launcher).
Their entries say `converted: command line`. The trainer is the TRL trainer the script builds; scripts of
trainers `trl` has no command for (trl.experimental) are left out. The accelerate config files these name
(TRL's examples/accelerate_configs, a multi-node one from TRL's docs, gpt-oss-recipes' zero3) are copied too,
listed under `accelerate_configs` with the path a config names them by.

    python tools/collect_real_configs.py --trl /path/to/trl --handbook /path/to/alignment-handbook \\
        --open-r1 /path/to/open-r1 [--trl-jobs DIR --gpt-oss-recipes DIR --smol-course DIR --optimum-neuron DIR]
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "tests" / "real_configs"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def license_of(repo: Path, commit: str) -> str:
    try:
        text = git(repo, "show", f"{commit}:LICENSE")
    except subprocess.CalledProcessError:  # no LICENSE file: the license the README states
        readme = git(repo, "show", f"{commit}:README.md")
        stated = re.search(r"under the \*{0,2}([\w.\- ]+?) License", readme)
        return f"{stated.group(1)} (stated in README.md, no LICENSE file)" if stated else "unknown"
    return (
        "Apache-2.0" if "Apache License" in text and "Version 2.0" in text else text.splitlines()[0].strip()
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trl", type=Path, required=True)
    parser.add_argument("--handbook", type=Path, required=True)
    parser.add_argument("--open-r1", type=Path, required=True)
    for name in ("--trl-jobs", "--gpt-oss-recipes", "--smol-course", "--optimum-neuron"):
        parser.add_argument(name, type=Path)
    ns = parser.parse_args()
    entries: list[dict[str, Any]] = []
    accelerate: list[dict[str, Any]] = []

    def add(
        repo: Path,
        name: str,
        path: str,
        text: str,
        trainer: str | None,
        lines: str | None = None,
        *,
        converted: bool = False,
        into: list[dict[str, Any]] = entries,
        named: str | None = None,
    ) -> None:
        commit = git(repo, "rev-parse", "HEAD").strip()
        stem = re.sub(r"\.(yaml|yml|md|py|sh)$", "", path).replace("/", "-")
        file = f"{name.split('/')[1]}/{stem}{'-L' + lines.split('-')[0] if lines else ''}.yaml"
        (OUT / file).parent.mkdir(parents=True, exist_ok=True)
        (OUT / file).write_text(text)
        entry: dict[str, Any] = {"file": file, "repository": name, "commit": commit, "path": path}
        if lines:
            entry["lines"] = lines
        entry["license"] = license_of(repo, commit)
        if trainer is not None:
            entry["trainer"] = trainer
        if converted:
            entry["converted"] = "command line"
        if named is not None:
            entry["named"] = named  # the path trl configs name it by (relative to the working directory)
        into.append(entry)

    def commands(repo: Path, name: str, path: str, trainer_of: Any) -> None:
        """Every training command line of a file, written out as a trl config."""
        text = git(repo, "show", f"HEAD:{path}")
        # A shell recipe's variables (the last assignment: the `else` of a graph-extraction switch is the real run)
        variables = dict(re.findall(r"^\s*([A-Z_][A-Z0-9_]*)=\"?([^\"\n$]*)\"?\s*(?:#.*)?$", text, re.M))
        for start, end, words in command_lines(text):
            found = config_of(words, variables)
            if found is None:
                continue
            script, config = found
            trainer = trainer_of(script)
            if trainer is None or not config or "config" in config:
                continue  # `--config FILE` names a file the page does not hold
            add(
                repo,
                name,
                path,
                yaml.safe_dump(config, sort_keys=False),
                trainer,
                f"{start}-{end}",
                converted=True,
            )

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

    # TRL's own scripts: the trainer each builds, when `trl` has a command for it.
    for path in git(
        ns.trl, "ls-tree", "-r", "--name-only", "HEAD", "trl/scripts", "examples/scripts"
    ).split():
        if path.endswith(".py"):
            kind = trl_trainer(git(ns.trl, "show", f"HEAD:{path}"))
            commands(
                ns.trl, "huggingface/trl", path, lambda script, kind=kind, path=path: own(script, path, kind)
            )
    for path in git(ns.trl, "ls-tree", "-r", "--name-only", "HEAD", "examples/accelerate_configs").split():
        add(
            ns.trl,
            "huggingface/trl",
            path,
            git(ns.trl, "show", f"HEAD:{path}"),
            None,
            into=accelerate,
            named=path,
        )
    # TRL's multi-node guide: the accelerate config it tells users to write (`multi_node.yaml`)
    doc = "docs/source/distributing_training.md"
    block = yaml_block_after(git(ns.trl, "show", f"HEAD:{doc}"), "Create an `accelerate` config file")
    if block is not None:
        start, end, text = block
        add(
            ns.trl,
            "huggingface/trl",
            doc,
            text,
            None,
            f"{start}-{end}",
            into=accelerate,
            named="multi_node.yaml",
        )

    if ns.trl_jobs:
        for path in git(ns.trl_jobs, "ls-tree", "-r", "--name-only", "HEAD", "trl_jobs/configs").split():
            add(ns.trl_jobs, "huggingface/trl-jobs", path, git(ns.trl_jobs, "show", f"HEAD:{path}"), "sft")
    if ns.gpt_oss_recipes:
        repo = ns.gpt_oss_recipes
        for path in ("configs/sft_full.yaml", "configs/sft_lora.yaml"):
            add(repo, "huggingface/gpt-oss-recipes", path, git(repo, "show", f"HEAD:{path}"), "sft")
        path = "configs/zero3.yaml"
        add(
            repo,
            "huggingface/gpt-oss-recipes",
            path,
            git(repo, "show", f"HEAD:{path}"),
            None,
            into=accelerate,
            named=path,
        )
        # README: `accelerate launch --config_file configs/zero3.yaml sft.py --config configs/sft_full.yaml`
        readme = git(repo, "show", "HEAD:README.md")
        for start, end, words in command_lines(readme):
            found = config_of(words, {})
            if found is None or "config" not in found[1]:
                continue
            config = dict(found[1])
            base = yaml.safe_load(git(repo, "show", f"HEAD:{config.pop('config')}"))
            add(
                repo,
                "huggingface/gpt-oss-recipes",
                "README.md",
                yaml.safe_dump({**base, **config}, sort_keys=False),
                "sft",
                f"{start}-{end}",
                converted=True,
            )
    if ns.smol_course:
        for path in git(ns.smol_course, "ls-tree", "-r", "--name-only", "HEAD", "units/en").split():
            if path.endswith(".md"):
                commands(ns.smol_course, "huggingface/smol-course", path, trl_command)
    if ns.optimum_neuron:
        repo = ns.optimum_neuron
        for path in git(repo, "ls-tree", "-r", "--name-only", "HEAD", "examples/training").split():
            if path.endswith(".sh"):
                script = (
                    git(repo, "show", f"HEAD:{path.removesuffix('.sh')}.py") if path.endswith(".sh") else ""
                )
                kind = "sft" if "SFTTrainer" in script or "SFTConfig" in script else None
                py = path.removesuffix(".sh") + ".py"
                commands(
                    repo,
                    "huggingface/optimum-neuron",
                    path,
                    lambda script, kind=kind, py=py: own(script, py, kind),
                )

    (OUT / "PROVENANCE.yaml").write_text(
        "# Real trl configs, copied as found by tools/collect_real_configs.py; one entry per file (`converted`:\n"
        "# a command line written out as the trl config YAML it amounts to). `accelerate_configs`: the accelerate\n"
        "# config files those name, with the path they name them by.\n"
        + yaml.safe_dump({"configs": entries, "accelerate_configs": accelerate}, sort_keys=False, width=120)
    )
    print(f"{len(entries)} configs, {len(accelerate)} accelerate configs")
    return 0


TRAINER_CLASSES = {
    "SFTTrainer": "sft",
    "DPOTrainer": "dpo",
    "KTOTrainer": "kto",
    "RewardTrainer": "reward",
    "GRPOTrainer": "grpo",
    "RLOOTrainer": "rloo",
    "DistillationTrainer": "distillation",
}
LAUNCHERS = ("python", "python3", "accelerate", "trl", "torchrun")


def trl_trainer(source: str) -> str | None:
    """The `trl` command of the trainer a script builds: one imported from `trl` itself (not trl.experimental)."""
    for block in re.findall(r"^\s*from trl import (\([^)]*\)|[^\n]*)", source, re.M):
        for cls, kind in TRAINER_CLASSES.items():
            if re.search(rf"\b{cls}\b", block):
                return kind
    return None


def own(script: str, path: str, kind: str | None) -> str | None:
    """A file's command lines that run the file's own script (not `trl vllm-serve` beside them)."""
    return kind if Path(script).name == Path(path).name else None


def trl_command(script: str) -> str | None:
    """`trl sft` and TRL's own scripts (trl/scripts/sft.py, fetched by URL or run by path)."""
    found = re.search(r"(?:^|/)trl/scripts/(\w+)\.py$", script) or re.fullmatch(r"trl (\w+)", script)
    return found.group(1) if found and found.group(1) in TRAINER_CLASSES.values() else None


def command_lines(text: str) -> list[tuple[int, int, list[str]]]:
    """(first line, last line, words) of each command line that starts a launcher (continuations joined)."""
    lines = text.splitlines()
    found = []
    number = 0
    while number < len(lines):
        line = lines[number].strip()
        words = line.split()
        first = next((w for w in words if "=" not in w), "")  # skip VAR=value prefixes
        if first not in LAUNCHERS and not (words[:3] and words[0] == "hf" and "uv" in words[:3]):
            number += 1
            continue
        start = number
        command = line
        while command.endswith("\\") and number + 1 < len(lines):
            number += 1
            command = command[:-1] + " " + lines[number].strip()
        number += 1
        try:
            words = shlex.split(command, comments=True)
        except ValueError:
            continue
        found.append((start + 1, number, words))
    return found


def config_of(words: list[str], variables: dict[str, str]) -> tuple[str, dict[str, Any]] | None:
    """(script, keys) of `trl <trainer> ARGS`, `python SCRIPT ARGS`, `accelerate launch OPTIONS SCRIPT ARGS`,
    `torchrun OPTIONS SCRIPT ARGS` (torchrun's options dropped), `hf jobs uv run ... URL ARGS`."""
    words = [re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), w) for w in words]
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]  # CUDA_VISIBLE_DEVICES=0 ...
    if not words:
        return None
    launch: list[str] = []
    if words[0] == "trl" and len(words) > 1:
        return f"trl {words[1]}", options(words[2:])
    script_at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script_at is None:
        return None
    if words[0] == "accelerate" and words[1:2] == ["launch"]:
        launch = words[2:script_at]
    return words[script_at], {**options(launch), **options(words[script_at + 1 :])}


def options(words: list[str]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("--"):
            continue
        name, _, inline = word[2:].partition("=")
        values = [inline] if inline else []
        while not inline and index < len(words) and not words[index].startswith("--"):
            values.append(words[index])
            index += 1
        parsed = [yaml.safe_load(v) if v else v for v in values]
        keys[name.replace("-", "_")] = True if not parsed else parsed[0] if len(parsed) == 1 else parsed
    return keys


def yaml_block_after(text: str, marker: str) -> tuple[int, int, str] | None:
    """The first ```yaml block after `marker`: (first line, last line, text)."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if marker in line), None)
    if at is None:
        return None
    start = next(i for i in range(at, len(lines)) if lines[i].strip() == "```yaml") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
    return start + 1, end, "".join(lines[start:end])


if __name__ == "__main__":
    raise SystemExit(main())
