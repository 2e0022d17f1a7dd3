"""Write warmup/data/trl_cli_fields.json, the field lists a base install without TRL reads trl configs with, from
the installed TRL, accelerate and transformers (warmup.job.trl_fields); run it in the locked stack's venv:

    python tools/trl_cli_fields.py > warmup/data/trl_cli_fields.json
"""

from __future__ import annotations

import json
import sys

from warmup.job.trl_fields import build

if __name__ == "__main__":
    json.dump(build(), sys.stdout, indent=1)
    sys.stdout.write("\n")
