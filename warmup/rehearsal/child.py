"""One run in its own interpreter: `python -m warmup.rehearsal.child RUN_JSON RESULT_JSON [PROGRESS]`.

Used for multi-process jobs (each `torchrun` rank runs this; rank 0 writes the result) and when
forking is not wanted. Forked children call `drivers.run_to_file` directly instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from warmup.rehearsal.drivers import RunJob, run_to_file

    job = RunJob.from_json(Path(argv[0]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    progress = Path(argv[2]) if len(argv) > 2 and rank == 0 else None
    return run_to_file(job, Path(argv[1]), rank=rank, progress=progress)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
