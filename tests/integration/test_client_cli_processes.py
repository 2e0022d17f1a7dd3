"""The pod side's boundaries in fresh interpreters: what it imports with and without the server packages,
and the sitecustomize that gives the command Dynamo's recompile limits (tests/unit/test_client_cli.py: the
parsing and the client, in process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from warmup.pod.training_env import SITECUSTOMIZE_DIRECTORY as DIRECTORY

SERVER_PACKAGES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "boto3",
    "botocore",
    "pydantic_settings",
)


NOT_IN_THE_BASE_INSTALL = (*SERVER_PACKAGES, "httpx")  # the base install: pydantic, pyyaml, certifi


def imported_after(code: str, *, absent: tuple[str, ...] = ()) -> list[str]:
    """sys.modules after `code` in a fresh interpreter where the `absent` packages are not installed."""
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in absent)  # find_spec: None; import: error
    probe = f"import sys\n{hide}{code}\nprint(__import__('json').dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_pod_side_runs_without_any_server_package():
    """A training image has the base install only: the client side imports and builds its CLI there."""
    modules = imported_after(
        "import warmup.job.spec, warmup.toolchain.memo, warmup.client.pulling, warmup.pod.callback.observer, warmup.manifest\n"
        "from warmup.cli import build_parser; build_parser('pull').parse_args(['pull', 'x.yaml', '--dest', 'd'])",
        absent=NOT_IN_THE_BASE_INSTALL,
    )
    assert "warmup.pod.callback" in modules and "transformers" in modules  # the check did import them


def test_the_client_side_imports_no_server_package_even_when_installed():
    # warmup.pod.callback is left out: transformers imports accelerate, which imports boto3 when it is
    # installed (for SageMaker); that is theirs, and the test above shows the callback needs none.
    modules = imported_after(
        "import warmup.job.spec, warmup.toolchain.memo, warmup.client.pulling, warmup.manifest, warmup.cli.pod"
    )
    assert sorted({m.split(".")[0] for m in modules} & set(NOT_IN_THE_BASE_INSTALL)) == []
    assert "torch" not in modules and "transformers" not in modules  # `warmup pull` starts fast


def test_the_sitecustomize_raises_the_limits_and_runs_the_images_own(tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITE'] = 'ran'\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(DIRECTORY), str(image), os.environ.get("PYTHONPATH", "")]),
        "WARMUP_RECOMPILE_LIMIT": "41",
        "WARMUP_ACCUMULATED_RECOMPILE_LIMIT": "900",
    }
    code = (
        "import os, torch\n"
        "import torch._dynamo.config as c\n"
        "print(c.recompile_limit, c.accumulated_recompile_limit, os.environ.get('IMAGE_SITE'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["41", "900", "ran"]
    # Limits are only ever raised, and nothing happens without the variables.
    env |= {"WARMUP_RECOMPILE_LIMIT": "3", "WARMUP_ACCUMULATED_RECOMPILE_LIMIT": "oops"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["8", "256", "ran"], done.stderr
    assert Path(DIRECTORY / "sitecustomize.py").is_file()


def test_the_sitecustomize_puts_the_canonical_kernel_layout_into_inductor_when_exec_asks():
    """WARMUP_KERNEL_LAYOUT (set by exec for an Inductor cache): every process keys its kernels by the content of
    its installs and builds no precompiled header before a kernel needs one (warmup/layout.py)."""
    code = (
        "import torch._inductor.codecache as c\n"
        "print(*(getattr(f, '_warmup_canonical_layout', False) for f in (c.write, c._precompile_header)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DIRECTORY), os.environ.get("PYTHONPATH", "")])}
    for value, expected in (("1", ["True", "True"]), (None, ["False", "False"])):
        run_env = {k: v for k, v in env.items() if k != "WARMUP_KERNEL_LAYOUT"}
        if value is not None:
            run_env["WARMUP_KERNEL_LAYOUT"] = value
        done = subprocess.run(
            [sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == expected, done.stderr


def test_the_sitecustomize_splits_a_model_compiled_in_place_whose_compile_first_imports_dynamo(tmp_path):
    """DeepSpeed's engine compiles the model in place (`nn.Module.compile`), and that compile is what first imports
    Dynamo: the hook on it is installed as torch is imported, so the trace skip still splits that model."""
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "split.json").write_text("{}")
    code = (
        "import sys, torch\n"
        "dynamo_before = 'torch._dynamo.eval_frame' in sys.modules\n"
        "class Backbone(torch.nn.Linear):\n"
        "    base_model = property(lambda self: self)\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.model = Backbone(2, 2)\n"
        "    base_model = property(lambda self: self.model)\n"
        "    def forward(self, x):\n"
        "        return self.model(x)\n"
        "model = Model()\n"
        "model.compile(backend='eager')\n"
        "from warmup.trace_skip.serve import active\n"
        "print(dynamo_before, active() is not None, 'forward' in vars(model.model))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(DIRECTORY), os.environ.get("PYTHONPATH", "")]),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
        "WARMUP_SPEC": str(tmp_path / "job.yaml"),
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["False", "True", "True"], (done.stdout, done.stderr)
