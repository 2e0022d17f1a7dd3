"""What each reliability scenario did, for the README's figures table.

Each test asserts its own outcome (no data lost, no 5xx); the ledger only counts what was tried, so
that `benchmarks/reliability_figures.py` can print the table from a real run. Rows go to the JSON-lines
file named by WARMUP_RELIABILITY_LEDGER; without it, recording is a no-op.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

LEDGER_ENV = "WARMUP_RELIABILITY_LEDGER"


@dataclass(frozen=True)
class Row:
    scenario: str
    faults_injected: int = 0
    jobs_completed: int = 0
    jobs_failed_with_reason: int = 0
    data_lost: int = 0
    bad_inputs: int = 0
    # 5xx answered by our service (never counted: 503s a fault injector made up); None: the
    # scenario made no requests to the service
    responses_5xx: int | None = None
    requests: int = 0  # requests the scenario made (to the service, or to the store through a fault proxy)
    p99_ms: float | None = None


def record(row: Row) -> None:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    with Path(path).open("a") as out:
        out.write(json.dumps(asdict(row)) + "\n")


def read(path: Path) -> list[Row]:
    return [Row(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
