"""The proof for the jobs issue 13 made warmable: LoRA SFT, LoRA DPO, KTO, distillation, padding-free SFT, packed
SFT ending on a partial packed batch, and GRPO with LoRA.

Each test runs `warmup warm` on a spec of the tiny model (one or two signatures, to keep the CPU time small),
then the user's TRL job in a fresh process (tests/support/train_job.py) with other weights and other data over that
cache: no FX or AOTAutograd cache miss or bypass, no file in the cache directory but empty kernel locks, and the
warmed shapes are the ones the job met.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.support.jobs import (
    known_trace_loss,
    no_fresh_compiles,
    only_empty_locks_appeared,
    run,
    run_job,
    served_warm,
    write_spec,
)
from warmup.artifacts import list_paths

LORA = {"lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"]}


def warm_then_train(
    spec: Path, weights: Path, tmp_path: Path, *, labels: list[str], **job: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`warmup warm` the spec (its plan must be `labels`), then train over the cache in a fresh process."""
    cache = tmp_path / "cache"
    warm = run([sys.executable, "-m", "warmup", "warm", spec, "--cache-dir", cache])
    assert warm.returncode == 0, warm.stderr[-5000:]
    manifest = json.loads((cache / "trl-warmup.json").read_text())
    entries = manifest["entries"].values()
    assert sorted(entry["signature"]["phase"] + " " + _shape(entry) for entry in entries) == sorted(labels)
    assert all(entry["status"] == "ok" for entry in entries)
    before = list_paths(cache)
    report = run_job(spec, weights, cache, tmp_path / "job.json", **job)
    assert no_fresh_compiles(report), report["fresh_compiles"]
    assert only_empty_locks_appeared(cache, before) == []
    return report, manifest


def _shape(entry: dict[str, Any]) -> str:
    signature = entry["signature"]
    return f"{signature['batch']}x{signature['seq_len']}"


def test_lora_sft_with_gradient_checkpointing(tiny_model_dir, user_weights_dir, tmp_path):
    spec = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {
            "per_device_train_batch_size": 2,
            "max_length": 32,
            "pad_to_multiple_of": 32,
            "gradient_checkpointing": True,
        },
        {"min_tokens": 20, "max_tokens": 32},
        peft=LORA,
    )
    report, manifest = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 2x32"],
        low=20,
        split=26,
        high=32,
        steps=2,
        data_seed=7,
    )
    (entry,) = manifest["entries"].values()
    assert entry["signature"]["frozen"] and entry["signature"]["gradient_checkpointing"]
    assert {tuple(shape) for shape in report["shapes"]} == {(2, 32)}
    if known_trace_loss(checkpointed=True) is None:
        # the trace is skipped too: a LoRA model's backbone is split and served like any model's
        assert report["trace_skip"]["hits"] > 0 and report["trace_skip"]["misses"] == 0, report["trace_skip"]
        assert report["counters"].get("frames", {}).get("total", 0) == 0, report["counters"]
    else:
        assert served_warm(report), (report["counters"], report["trace_skip"])


def test_lora_dpo(tiny_model_dir, user_weights_dir, tmp_path):
    """The reference is the policy with its adapter disabled: TRL calls the bare module, nothing to warm."""
    spec = write_spec(
        tmp_path / "dpo.yaml",
        "dpo",
        tiny_model_dir,
        {"per_device_train_batch_size": 1, "max_length": 32, "pad_to_multiple_of": 32},
        {"min_tokens": 20, "max_tokens": 32},
        peft=LORA,
    )
    report, manifest = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 2x32", "ref 2x32"],
        low=20,
        split=26,
        high=32,
        steps=2,
    )
    notes = {e["signature"]["phase"]: (e["files"], e.get("note", "")) for e in manifest["entries"].values()}
    assert notes["ref"][0] == [] and notes["train"][0]
    assert {tuple(shape) for shape in report["shapes"]} == {(2, 32)}


def test_kto_with_its_reference_model_and_kl_rows(tiny_model_dir, user_weights_dir, tmp_path):
    spec = write_spec(
        tmp_path / "kto.yaml",
        "kto",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
        {"min_tokens": 20, "max_tokens": 32, "num_train_examples": 8},
    )
    report, _ = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 2x32", "old_logps 2x32", "ref 2x32"],
        low=20,
        split=26,
        high=32,
        steps=2,
        data_seed=5,
    )
    assert {tuple(shape) for shape in report["shapes"]} == {(2, 32), ("KL", 2, 32)}


def test_distillation_compiles_nothing_under_inductor(tiny_model_dir, user_weights_dir, tmp_path):
    """TRL's distillation trainer runs the student and the teacher through a redirected forward: nothing goes
    through the compiled wrapper, so warming is empty entries that say why, and training compiles no graph."""
    spec = write_spec(
        tmp_path / "distillation.yaml",
        "distillation",
        tiny_model_dir,
        {"per_device_train_batch_size": 2, "max_completion_length": 8, "pad_to_multiple_of": 16},
        {"min_prompt_tokens": 5, "max_prompt_tokens": 14},
        teacher_model=tiny_model_dir,
    )
    report, manifest = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 2x32", "teacher 2x32", "generate_prefill 2x16"],
        low=5,
        split=10,
        high=14,
        steps=1,
    )
    assert all(not e["files"] for e in manifest["entries"].values())
    assert report["counters"].get("stats", {}).get("unique_graphs", 0) == 0
    # the student's and the teacher's backbones ran on the planned width (prompts pad to 16, completions to 16)
    assert {tuple(shape)[:2] for shape in report["shapes"]} == {(2, 32)}


def test_padding_free_sft_with_bfd_packing(tiny_model_dir, user_weights_dir, tmp_path):
    """Two bins of 20..32 tokens concatenate into one row of 40..64, padded to 64; the last batch's one bin too."""
    spec = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {
            "per_device_train_batch_size": 2,
            "max_length": 32,
            "pad_to_multiple_of": 64,
            "packing": True,
            "packing_strategy": "bfd",
        },
        {"min_tokens": 20, "max_tokens": 32},
    )
    report, _ = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 1x64"],
        examples=5,
        low=20,
        split=26,
        high=32,
        steps=3,
    )
    assert {tuple(shape) for shape in report["shapes"]} == {(1, 64)}


def test_packed_sft_ending_on_a_partial_packed_batch(tiny_model_dir, user_weights_dir, tmp_path):
    """Wrapped packing, packed row count unknown: the plan lists every last batch the packed dataset can have.
    Five examples of 32 tokens pack into 5 rows: batches of 2, 2 and a last one of 1."""
    spec = write_spec(
        tmp_path / "sft.yaml",
        "sft",
        tiny_model_dir,
        {
            "per_device_train_batch_size": 2,
            "max_length": 32,
            "pad_to_multiple_of": 32,
            "packing": True,
            "packing_strategy": "wrapped",
        },
        {"min_tokens": 20, "max_tokens": 32},
    )
    report, _ = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 2x32", "train 1x32"],
        examples=5,
        low=32,
        split=31,
        high=32,
        steps=3,
    )
    assert [tuple(shape) for shape in report["shapes"]] == [(2, 32), (2, 32), (1, 32)]


def test_grpo_with_lora(tiny_model_dir, user_weights_dir, tmp_path):
    """Prompts of 5..14 tokens pad to 16, completions of at most 8 to 16: one training width, 32."""
    spec = write_spec(
        tmp_path / "grpo.yaml",
        "grpo",
        tiny_model_dir,
        {
            "per_device_train_batch_size": 2,
            "num_generations": 2,
            "max_completion_length": 8,
            "pad_to_multiple_of": 16,
        },
        {"min_prompt_tokens": 5, "max_prompt_tokens": 14},
        peft=LORA,
    )
    report, _ = warm_then_train(
        spec,
        user_weights_dir,
        tmp_path,
        labels=["train 2x32", "generate_prefill 2x16"],
        low=5,
        split=10,
        high=14,
        steps=2,
    )
    assert {tuple(shape) for shape in report["shapes"]} == {(2, 32, 0)}
