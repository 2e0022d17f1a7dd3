"""A job of 3 processes, warmed with 2, trains under `torchrun --nproc-per-node=3` compiling nothing.

Every rank of a DDP job compiles the same graphs at any world size above 1 (docs/multi-node.md), so
the rehearsal runs 2 processes, each with the thread count a rank of the job runs (1: torchrun's
default with several processes per node, pinned here as a real job pins it). Each of the 3 training
ranks, in a fresh process over that cache, must miss nothing in Inductor's FX and AOTAutograd caches,
leave no new file, and meet the warmed shape.
"""

from __future__ import annotations

import json
import socket
import sys

from tests.support.jobs import TRAIN_JOB, no_fresh_compiles, only_empty_locks_appeared, run, write_spec
from warmup.artifacts import list_paths


def test_a_three_process_job_warmed_with_two_trains_with_zero_compiles(
    tiny_model_dir, user_weights_dir, tmp_path, monkeypatch
):
    from warmup.rehearsal.local import warm_directory
    from warmup.spec import load_spec

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what each rank of the job runs (and the toolchain says)
    spec_path = write_spec(
        tmp_path / "sft-3.yaml",
        "sft",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
        {"min_tokens": 10, "max_tokens": 32},
    )
    spec_path.write_text(spec_path.read_text().replace("device: cpu", "device: cpu\n  world_size: 3"))
    spec = load_spec(spec_path)
    cache = tmp_path / "cache"
    report = warm_directory(spec, cache)
    assert report.ok, [(r.signature.shape_label, r.note, r.log_tail[-3000:]) for r in report.results]
    assert report.processes == 2
    (result,) = report.results
    assert result.signature.world_size == 3 and result.files
    manifest = json.loads((cache / "trl-warmup.json").read_text())
    assert manifest["toolchain"]["num_threads"] == 1

    before = list_paths(cache)
    out = tmp_path / "job.json"
    port = _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", "--master-addr=127.0.0.1"]
    command += [f"--master-port={port}", TRAIN_JOB, "--spec", spec_path, "--weights", user_weights_dir]
    command += ["--cache-dir", cache, "--out", out, "--steps", 2, "--min-tokens", 10, "--split", 31]
    command += ["--max-tokens", 32]
    done = run(command)
    assert done.returncode == 0, done.stderr[-6000:]
    for rank in range(3):
        report_path = out if rank == 0 else out.with_suffix(f".rank{rank}.json")
        ranked = json.loads(report_path.read_text())
        assert no_fresh_compiles(ranked), (rank, ranked["fresh_compiles"])
        assert {tuple(shape) for shape in ranked["shapes"]} == {(2, 32)}
        assert ranked["counters"]["inductor"]["fxgraph_cache_hit"] > 0
        assert ranked["counters"]["aot_autograd"]["autograd_cache_hit"] > 0
    assert only_empty_locks_appeared(cache, before) == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
