"""The directory `warmup exec` puts first on the training command's PYTHONPATH (see sitecustomize.py).

Nothing imports this package; `DIRECTORY` is where its `sitecustomize` module lives.
"""

from __future__ import annotations

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
