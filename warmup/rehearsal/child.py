"""One unit run in its own interpreter: `python -m warmup.rehearsal.child UNIT_JSON RESULT_JSON`.

Used for multi-process jobs (each `torchrun` rank runs this; rank 0 writes the result) and when
forking is not wanted. Forked children call `drivers.run_unit_to_file` directly instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from warmup.rehearsal.drivers import UnitJob, run_unit_to_file

    job = UnitJob.from_json(Path(argv[0]).read_text())
    return run_unit_to_file(job, Path(argv[1]), rank=int(os.environ.get("RANK", "0")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
