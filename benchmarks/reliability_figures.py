"""The README's reliability figures, from a real run of tests/reliability.

Runs the reliability suite with a ledger file, then prints one row per scenario and the totals:
faults injected, jobs completed (and failed with a recorded reason), data lost, bad inputs tried,
5xx seen, requests and p99 latency where a scenario measured them. Exits non-zero if any test failed,
so a table is only printed for a green run.

    python benchmarks/reliability_figures.py [extra pytest args]
    python benchmarks/reliability_figures.py --ledger FILE   # the table of a run made with
                                                             # WARMUP_RELIABILITY_LEDGER=FILE (e.g. CI's)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.reliability.ledger import LEDGER_ENV, Row, read  # noqa: E402

COUNTS = [f.name for f in fields(Row) if f.name not in ("scenario", "p99_ms")]


def table(rows: list[Row]) -> str:
    header = ["scenario", *COUNTS, "p99 ms"]
    lines = ["| " + " | ".join(h.replace("_", " ") for h in header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        p99 = f"{row.p99_ms:.0f}" if row.p99_ms is not None else ""
        counts = ["n/a" if getattr(row, c) is None else str(getattr(row, c)) for c in COUNTS]
        lines.append("| " + " | ".join([row.scenario, *counts, p99]) + " |")
    totals = [str(sum(getattr(r, c) or 0 for r in rows)) for c in COUNTS]
    lines.append("| **total** | " + " | ".join(f"**{t}**" for t in totals) + " | |")
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--ledger"]:
        print(table(read(Path(sys.argv[2]))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Path(tmp) / "ledger.jsonl"
        env = {**os.environ, LEDGER_ENV: str(ledger)}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/reliability", "-q", *sys.argv[1:]], cwd=REPO_ROOT, env=env
        )
        if result.returncode != 0:
            print(f"reliability tests failed (exit {result.returncode}); no figures", file=sys.stderr)
            return result.returncode
        rows = read(ledger) if ledger.exists() else []
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
