"""warmup.activate: what a training process gets, and the clear errors before anything is set."""

from __future__ import annotations

import json

import pytest

import warmup
from tests.fixtures import factories
from warmup.errors import NotWarmedError, ToolchainMismatchError


@pytest.fixture
def spec_file(tiny_model_dir, tmp_path):
    return factories.write_activation_spec(tmp_path / "job.yaml", tiny_model_dir)


def test_a_missing_cache_dir_is_not_warmed(spec_file, tmp_path):
    with pytest.raises(NotWarmedError, match="warmup warm"):
        warmup.activate(spec_file, cache_dir=tmp_path / "nothing-here")


def test_a_cache_warmed_under_another_toolchain_is_refused_by_field(spec_file, tmp_path):
    from warmup.toolchain.probes import current_toolchain

    theirs = current_toolchain("inductor", "cpu").model_copy(update={"torch": "2.14.1", "num_threads": 64})
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "trl-warmup.json").write_text(json.dumps({"toolchain": theirs.model_dump(mode="json")}))
    with pytest.raises(ToolchainMismatchError) as raised:
        warmup.activate(spec_file, cache_dir=cache)
    assert set(raised.value.differences) == {"torch", "num_threads"}
