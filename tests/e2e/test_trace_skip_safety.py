"""The trace skip's safety (warmup/trace_skip/), in this process with real compiles of the tiny model.

One rehearsal-like recording compiles the backbone of two models that differ in one config field
(`rms_norm_eps`, which no guard torch can save holds); each call is captured, saved and checked. Then:
- a model whose config differs in that one field is refused the other's artifact: its call is a miss,
  served by Dynamo's own compile, never by the other model's graph;
- the numeric check rejects a tampered artifact: the same call compiled while the library computed
  something else loads, passes torch's guards (code is not among them), and gives other numbers than a
  fresh compile, so it would not be stored; and it does so in each of 30 checks, in which the sound
  artifact passes every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.tiny_model import init_model
from warmup.trace_skip import artifacts, capture, serve, split

REPEATS = 30  # numeric checks of each artifact


def _model(directory: Path, eps: float | None = None) -> Any:
    model = init_model(directory, seed=3)
    if eps is not None:
        model.config.rms_norm_eps = eps
        for module in model.modules():
            if hasattr(module, "variance_epsilon"):
                module.variance_epsilon = eps
    model.config.use_cache = False
    return model.train()


def _batch() -> dict[str, Any]:
    import torch

    ids = torch.randint(5, 60, (2, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@pytest.fixture
def inductor_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor"


def test_an_artifact_is_refused_for_another_config_and_a_tampered_one_fails_the_check(
    tiny_model_dir, tmp_path, inductor_dir, monkeypatch
):
    import torch

    assert split.unavailable_reason() is None
    recorder = capture.start_recording()
    assert recorder is not None
    try:
        plain, other = _model(tiny_model_dir), _model(tiny_model_dir, eps=1e-2)
        for model in (plain, other):
            torch.compile(model)(**_batch()).loss.backward()
    finally:
        split.remove_hook(recorder.wrap)
    cache = tmp_path / "cache"
    outcomes = recorder.capture(cache)
    assert [o.stored for o in outcomes] == [True, True], [o.reason for o in outcomes]
    mine, theirs = recorder.calls.values()
    assert mine.split.digest != theirs.split.digest

    # tampered: the same call compiled while the library's norm computed something else (code is not in the
    # guards torch can save) loads, passes the guards, and is rejected by the numeric check
    from transformers.models.qwen3 import modeling_qwen3

    norm = modeling_qwen3.Qwen3RMSNorm.forward
    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", lambda self, x: norm(self, x) * 1.001)
    tampered = cache / "tampered.aot"
    capture.compile_call(mine).save_compiled_function(
        str(tampered), external_data=artifacts.hidden_functions(mine.split.module)
    )
    monkeypatch.undo()
    loaded = artifacts.load_artifact(tampered.read_bytes(), mine.split.module)
    assert loaded.guard_check(mine.split.module, *mine.args, **mine.kwargs)
    good = artifacts.load_artifact((cache / outcomes[0].path).read_bytes(), mine.split.module)
    # the check is deterministic, not lucky: the sound artifact passes and the tampered one fails every time
    # (the embedding's gradient, a parallel scatter-add, once made it refuse the sound one by chance)
    verdicts = [
        (capture.compare(mine, good, exact=True), capture.compare(mine, loaded, exact=True))
        for _ in range(REPEATS)
    ]
    assert [sound for sound, _ in verdicts] == [None] * REPEATS
    assert all(t is not None and "differs from a fresh compile" in t for _, t in verdicts), verdicts

    # a training process whose model differs in that one field: refused, a miss served by Dynamo's compile
    only_plain = tmp_path / "only-plain"
    (only_plain / artifacts.TRACE_DIR).mkdir(parents=True)
    for name in (outcomes[0].path, outcomes[0].path.replace(".aot", ".json"), "trace/split.json"):
        (only_plain / name).write_bytes((cache / name).read_bytes())
    state = serve.TraceSkip(only_plain)
    split.on_compiled_module(state.wrap)
    try:
        changed, same = _model(tiny_model_dir, eps=1e-2), _model(tiny_model_dir)
        compiled_changed, compiled_same = torch.compile(changed), torch.compile(same)
    finally:
        split.remove_hook(state.wrap)
    assert state.refused == {"for another model config": 1} and state.loaded == 1
    torch.manual_seed(0)
    out = compiled_changed(**_batch())
    assert (state.hits, state.misses) == (0, 1)
    # the changed model's own numbers (its eager loss), which the warmed graph would not give
    expected, warmed_model = _model(tiny_model_dir, eps=1e-2)(**_batch()), _model(tiny_model_dir)(**_batch())
    assert torch.allclose(out.loss, expected.loss, rtol=1e-5, atol=0)
    assert not torch.allclose(warmed_model.loss, expected.loss, rtol=1e-5, atol=0)
    compiled_same(**_batch())
    assert (state.hits, state.misses) == (1, 1)
