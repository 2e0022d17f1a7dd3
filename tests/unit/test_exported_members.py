"""The public Python surface: what users import from `warmup`, each name resolving, and `import warmup`
staying light enough for a training pod."""

from __future__ import annotations

import importlib
import sys

import warmup

EXPORTED = [
    "activate",
    "Activation",
    "WarmupCallback",
    "pull",
    "PullResult",
    "load_spec",
    "Spec",
    "Target",
    "DataFacts",
    "plan",
    "Plan",
    "Signature",
    "Toolchain",
    "dataset_facts",
    "DatasetFacts",
    "WarmupError",
    "SpecError",
    "ToolchainMismatchError",
    "NotWarmedError",
    "PartlyWarmedError",
    "WarmupFailedError",
    "UnwarmedCompileError",
    "BackgroundPullError",
    "ServerError",
    "ServerUnreachableError",
]

# What `import warmup` must not bring in: the ML stack and every server package.
HEAVY = ["torch", "transformers", "trl", "accelerate", "datasets", "fastapi", "starlette", "uvicorn",
         "sqlalchemy", "alembic", "psycopg", "pydantic_settings", "boto3", "httpx", "numpy"]  # fmt: skip


def test_all_is_the_public_surface():
    assert warmup.__all__ == EXPORTED


def test_every_exported_name_resolves():
    for name in EXPORTED:
        value = getattr(warmup, name)
        assert value is not None, name
        assert name in dir(warmup)
    assert issubclass(warmup.SpecError, warmup.WarmupError)
    assert all(
        issubclass(getattr(warmup, name), warmup.WarmupError) for name in EXPORTED if name.endswith("Error")
    )
    assert warmup.plan.__name__ == "plan_spec"  # planning a Spec: validate, read the model config, plan


def test_an_unknown_name_is_an_attribute_error():
    try:
        warmup.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError("warmup.no_such_name resolved")


def test_import_warmup_imports_nothing_heavy():
    """`import warmup` as a fresh interpreter does it: with no warmup module and none of HEAVY loaded, it
    loads only the package itself (each name loads on first use). sys.modules is restored afterwards."""
    saved = dict(sys.modules)
    try:
        for name in list(sys.modules):
            if name == "warmup" or name.startswith("warmup.") or name.split(".")[0] in HEAVY:
                del sys.modules[name]
        before = set(sys.modules)
        importlib.import_module("warmup")
        loaded = sorted(set(sys.modules) - before)
    finally:
        sys.modules.clear()
        sys.modules.update(saved)
    assert loaded == ["warmup"]


def test_the_version_is_the_installed_one():
    from importlib.metadata import version

    assert warmup.__version__ == version("trl-warmup")
