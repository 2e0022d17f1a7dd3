"""What one stack's test run showed, as warmup/data/stacks.json keeps it (docs/compatibility.md renders it, and
`warmup doctor` compares an image's versions with it): the versions of the venv this runs in, and for each
feature the tests of the run that prove it, passed and failed, from the run's JUnit XML.

    python tools/stack_record.py newest .venv-newest/junit.xml            # print the record
    python tools/stack_record.py newest .venv-newest/junit.xml --write    # and put it into warmup/data/stacks.json

Run it with the stack's own interpreter (`make test-newest` does).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import xml.etree.ElementTree as ElementTree
from importlib import metadata
from pathlib import Path

STACKS = Path(__file__).resolve().parents[1] / "warmup" / "data" / "stacks.json"
PACKAGES = ("torch", "transformers", "accelerate", "trl", "peft", "datasets", "deepspeed", "kernels")
# Each feature, and the test modules that prove it (dotted, as JUnit names them).
FEATURES = {
    "plan": ("tests.integration.planner.",),
    "zero compiles": ("tests.e2e.test_zero_compile", "tests.e2e.test_multi_process"),
    "relocation": ("tests.e2e.test_relocated_install",),
    "trace skip": ("tests.e2e.test_trace_skip",),
    "sharded jobs": ("tests.e2e.test_sharded_jobs",),
    "unit tier": ("tests.unit.",),
}


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def record(stack: str, junit: Path) -> dict[str, object]:
    features: dict[str, dict[str, int]] = {
        name: {"passed": 0, "failed": 0, "skipped": 0} for name in FEATURES
    }
    for case in ElementTree.parse(junit).iter("testcase"):
        name = case.get("classname", "")
        outcome = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        for feature, prefixes in FEATURES.items():
            if name.startswith(prefixes):
                features[feature][outcome] += 1
    return {
        "stack": stack,
        "recorded": datetime.date.today().isoformat(),
        "versions": versions(),
        "command": "make test-newest" if stack == "newest" else "make test",
        "features": {name: counts for name, counts in features.items() if any(counts.values())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stack", help="the stack's name (locked, newest)")
    parser.add_argument("junit", type=Path, help="the run's JUnit XML (pytest --junitxml)")
    parser.add_argument("--write", action="store_true", help="put the record into warmup/data/stacks.json")
    args = parser.parse_args()
    entry = record(args.stack, args.junit)
    json.dump(entry, sys.stdout, indent=1)
    sys.stdout.write("\n")
    if args.write:
        stacks = json.loads(STACKS.read_text())
        stacks["stacks"][args.stack] = entry
        STACKS.write_text(json.dumps(stacks, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
