"""The phase WarmupCallback gives a model call, from what transformers passes to the model's forward."""

from __future__ import annotations

import torch

from warmup.pod.callback.observer import _shape_of


def test_a_call_with_a_kv_cache_is_generation_whatever_transformers_calls_the_argument():
    model = torch.nn.Linear(4, 4).train()
    ids = torch.zeros(2, 16, dtype=torch.long)
    step = torch.zeros(2, 1, dtype=torch.long)
    cache = object()
    # transformers 5.24 passes the cache as `cache`; older versions as `past_key_values`
    for name in ("cache", "past_key_values"):
        assert _shape_of(model, (), {"input_ids": ids, name: cache}, False, None) == (
            "generate_prefill",
            2,
            16,
        )
        assert _shape_of(model, (), {"input_ids": step, name: cache}, False, None) == (
            "generate_decode",
            2,
            1,
        )
    # without a cache, a grad-free call in train mode is an old-log-prob pass
    assert _shape_of(model, (), {"input_ids": ids, "cache": None}, False, None) == ("old_logps", 2, 16)
    assert _shape_of(model, (), {"input_ids": ids}, True, None) == ("train", 2, 16)


def test_only_steps_that_met_no_new_shape_are_timed(tiny_model_dir, monkeypatch, tmp_path):
    """The step time the service calibrates advice with leaves out the steps that met a shape first (the
    ones that compile): here step 1 meets train 2x32 and step 3 meets train 2x64; steps 2 and 4 are timed."""
    from types import SimpleNamespace

    from warmup.pod.callback.observer import WarmupCallback

    spec = {
        "trainer": "sft",
        "model": str(tiny_model_dir),
        "args": {"per_device_train_batch_size": 2, "max_length": 64, "pad_to_multiple_of": 32, "bf16": False},
        "target": {"backend": "inductor", "device": "cpu"},
    }
    monkeypatch.setattr("warmup.pod.callback.observer.report_toolchain", lambda cache_dir, spec: {})
    callback = WarmupCallback(spec, cache_dir=tmp_path)
    model = torch.nn.Linear(4, 4).train()
    for step, seq_len in enumerate([32, 32, 64, 64], start=1):
        callback.on_step_begin(None, None, None)
        callback._on_forward(model, (), {"input_ids": torch.zeros(2, seq_len, dtype=torch.long)}, None)
        callback.on_step_end(None, SimpleNamespace(global_step=step), None)
    details = callback.build_report("completed")["details"]
    assert details["timed_steps"]["count"] == 2
    assert 0 < details["timed_steps"]["seconds"] < 60
    assert set(details["shapes"]) == {"train 2x32", "train 2x64"}
