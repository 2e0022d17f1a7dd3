"""Backends: the environment a process needs, artifact collection over real layouts, fresh compiles."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from warmup.artifacts import MANIFEST_NAME, ArtifactFile
from warmup.backends.base import (
    DYNAMO_ACCUMULATED_RECOMPILE_LIMIT,
    DYNAMO_RECOMPILE_LIMIT,
    FreshCompiles,
    recompile_limits,
)
from warmup.backends.inductor import InductorBackend
from warmup.backends.neuron import NeuronBackend
from warmup.backends.registry import get_backend
from warmup.errors import SpecError


def _write(root: Path, relative: str, content: bytes = b"x") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def test_get_backend_by_name_and_device():
    assert isinstance(get_backend("inductor"), InductorBackend)
    assert get_backend("inductor", "cuda").device == "cuda"
    assert isinstance(get_backend("neuron", "neuron"), NeuronBackend)
    with pytest.raises(SpecError, match="unknown backend"):
        get_backend("xla")
    with pytest.raises(SpecError):
        get_backend("neuron", "cpu")
    with pytest.raises(SpecError):
        get_backend("inductor", "neuron")


def test_recompile_limits_grow_with_the_plan_and_never_drop_below_dynamo_defaults():
    assert recompile_limits(1) == (9, 256)
    limit, accumulated = recompile_limits(40)
    assert limit >= 40 and accumulated >= 16 * limit
    previous = (0, 0)
    for plan_size in range(
        0, 300
    ):  # every size: at least Dynamo's defaults, and never less than a smaller plan
        limits = recompile_limits(plan_size)
        assert limits[0] >= DYNAMO_RECOMPILE_LIMIT and limits[1] >= DYNAMO_ACCUMULATED_RECOMPILE_LIMIT, (
            plan_size
        )
        assert limits[0] >= previous[0] and limits[1] >= previous[1], plan_size
        previous = limits


def test_inductor_env_points_at_the_cache_and_tags_isa_and_threads(tmp_path):
    import torch

    from warmup.toolchain.probes import cpu_vec_isa

    env = InductorBackend("cpu").env(tmp_path / "cache", plan_size=3)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "cache").absolute())
    tag = env["TORCH_COMPILE_CACHE_KEY_TAG"]
    assert cpu_vec_isa().replace(" ", "+") in tag and f"threads={torch.get_num_threads()}" in tag
    assert env["ACCELERATE_DYNAMO_USE_DYNAMIC"] == "False"
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == env["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    assert "isa" not in InductorBackend("cuda").key_tag()


def test_inductor_collects_everything_but_locks_temp_files_and_the_manifest(tmp_path):
    kept = [
        "fxgraph/ab/fabc/entry1",
        "aotautograd/aab/entry2",
        "ab/cabcdef.py",
        "ab/cabcdef.cpp",
        "ab/cabcdef.so",
        "triton/0/kernel/k.cubin",
    ]
    for relative in kept:
        _write(tmp_path, relative, relative.encode())
    for relative in ("locks/cabcdef.lock", "ab/.1234.5678.tmp", MANIFEST_NAME, "ab/.x.so.99.partial"):
        _write(tmp_path, relative)
    os.symlink(tmp_path / "ab/cabcdef.so", tmp_path / "ab/link.so")
    files = InductorBackend().collect(tmp_path)
    assert [f.path for f in files] == sorted(kept)
    so = next(f for f in files if f.path == "ab/cabcdef.so")
    assert so.sha256 == hashlib.sha256(b"ab/cabcdef.so").hexdigest() and so.size == len(b"ab/cabcdef.so")


def test_inductor_counter_sees_new_files_but_not_locks(tmp_path):
    _write(tmp_path, "ab/old.so")
    counter = InductorBackend().counter(tmp_path)
    assert not counter.fresh()
    _write(tmp_path, "locks/new.lock")
    assert not counter.fresh()
    _write(tmp_path, "cd/new.so")
    fresh = counter.fresh()
    assert fresh.new_files == ("cd/new.so",) and fresh.total == 1
    assert "cd/new.so" in fresh.describe()


def test_neuron_env_canonicalises_flags_pins_lnc_and_keeps_locks_local(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type transformer -O1 --cache_dir=/mnt/shared")
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    backend = NeuronBackend()
    env = backend.env(tmp_path / "neff", plan_size=4)
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] == str((tmp_path / "neff").absolute())
    assert env["NEURON_CC_FLAGS"] == "--model-type=transformer -O1"
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    locks = Path(env["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"])
    import tempfile

    assert locks.is_relative_to(tempfile.gettempdir())
    assert locks != backend.local_lock_dir(tmp_path / "other")


def test_neuron_configure_process_sets_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1   --model-type transformer")
    for name in (
        "TORCH_NEURONX_NEFF_CACHE_DIR",
        "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
        "TORCH_NEURONX_HLO_CACHE_DIR",
        "NEURON_LOGICAL_NC_CONFIG",
    ):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored by monkeypatch afterwards
    env = NeuronBackend().configure_process(tmp_path / "neff", plan_size=2)
    assert os.environ["NEURON_CC_FLAGS"] == env["NEURON_CC_FLAGS"] == "--model-type=transformer -O1"
    assert Path(env["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"]).is_dir()
    assert (tmp_path / "neff").is_dir()
    assert env["TORCH_NEURONX_HLO_CACHE_DIR"] == str((tmp_path / "neff" / "hlo").absolute())


def test_neuron_entries_carry_the_hlo_cache_and_the_trace_artifacts(tmp_path):
    name = "0123456789abcdef0123456789abcdef"
    good = ["hlo/ab/module.pb", f"trace/{name}.aot", f"trace/{name}.json", "trace/split.json"]
    for relative in (*good, "hlo/ab/module.pb.lock", "hlo/.module.tmp", "trace/tmpx8f2", "trace/other.aot"):
        _write(tmp_path, relative)
    assert [f.path for f in NeuronBackend().collect(tmp_path)] == sorted(good)


def test_neuron_collects_only_finished_neffs_at_their_sharded_place(tmp_path):
    key = "0123456789abcdef0123456789abcdef"
    other = "ffee" + "0" * 28
    good = [f"01/23/{key}.neff", f"ff/ee/{other}.neff"]
    for relative in good:
        _write(tmp_path, relative, b"NEFF" + relative.encode())
    for relative in (
        f"01/23/{key}.neff.tmp",  # mkstemp temp before rename
        f"01/23/tmpab12cd{key}",  # a partial write
        f"aa/bb/{key}.neff",  # wrong shard for the key
        f"01/{key}.neff",  # too shallow
        f"locks/{key}.lock",
        "neuron_cache_stats.json",
        MANIFEST_NAME,
    ):
        _write(tmp_path, relative)
    files = NeuronBackend().collect(tmp_path)
    assert [f.path for f in files] == sorted(good)
    assert all(isinstance(f, ArtifactFile) and f.size == 4 + len(f.path) for f in files)


def test_neuron_counter_counts_new_neffs_without_the_runtime(tmp_path):
    counter = NeuronBackend().counter(tmp_path)
    key = "ab12" + "9" * 28
    _write(tmp_path, f"ab/12/{key}.neff")
    _write(tmp_path, f"ab/12/{key}.neff.tmp")
    assert counter.fresh().new_files == (f"ab/12/{key}.neff",)


def test_fresh_compiles_describe_what_compiled():
    assert FreshCompiles().describe() == "no fresh compiles"
    fresh = FreshCompiles(counts={"fxgraph_cache_miss": 2, "autograd_cache_miss": 0}, new_files=("a", "b"))
    assert fresh.total == 4
    assert fresh.describe() == "fxgraph_cache_miss=2; 2 new file(s): a, b"
