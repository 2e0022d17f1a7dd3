"""The wheel, as `pip install trl-warmup[server]` and the images install it (not editable): it carries
the migrations the server runs at start-up, and pip compiles its bytecode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.installs import build_wheel
from warmup.db.migrate import head_revision

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(300)

MIGRATE = """
import json, sys
import warmup.db.migrate as migrate
url = f"sqlite:///{sys.argv[1]}"
migrate.upgrade(url)
print(json.dumps({"module": migrate.__file__, "revision": migrate.current_revision(url)}))
"""


def test_the_installed_wheel_migrates_a_database_with_its_own_migrations(tmp_path: Path) -> None:
    installed = tmp_path / "site"

    def pip(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    wheel = build_wheel(tmp_path / "build", ROOT)
    pip("install", "--quiet", "--no-deps", "--target", str(installed), str(wheel))
    assert (installed / "warmup" / "db" / "migrations" / "versions").is_dir()
    assert not (installed / "warmup" / "db" / "migrations").is_symlink()  # the files, not the link
    assert any((installed / "warmup" / "client" / "__pycache__").glob("pulling.*.pyc"))  # compiled by pip
    # One top-level import name: the service's folders install under it, as files, templates included.
    top_level = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")} - {"bin"}
    assert top_level == {"warmup"}
    for linked in ("api", "worker"):
        assert (installed / "warmup" / linked / "__init__.py").is_file()
        assert not (installed / "warmup" / linked).is_symlink()
    assert (installed / "warmup" / "api" / "templates" / "status.html").is_file()

    # Away from the checkout, with the installed package first on the path (its dependencies come
    # from this environment).
    env = {**os.environ, "PYTHONPATH": str(installed)}
    done = subprocess.run(
        [sys.executable, "-c", MIGRATE, str(tmp_path / "service.db")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert Path(result["module"]).is_relative_to(installed)
    assert result["revision"] == head_revision() is not None

    names = subprocess.run(
        [sys.executable, "-c", "import warmup.api.app, warmup.worker.main\nimport api"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert names.returncode == 1
    assert "ModuleNotFoundError: No module named 'api'" in names.stderr
