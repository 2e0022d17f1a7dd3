"""What a training process checks before it trusts a pulled cache (issue 14): the exact toolchain against
the one the pod remembered or predicted, strict mode, and why a compile happened.

The callback here is the real one, hooked on a real (tiny) torch module: what it sees is what it sees
in a Trainer (the hooks are the same); tests/integration/test_strict_exec.py runs it in a real TRL job.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.tiny_model import write_tiny_model
from warmup.client.local import read_local_manifest, save_local_manifest
from warmup.diagnosis import RunFacts, diagnose
from warmup.errors import ToolchainMismatchError, UnwarmedCompileError
from warmup.job.spec import Spec, load_spec
from warmup.manifest import Manifest
from warmup.planner.planning import plan_spec
from warmup.signature import Signature
from warmup.toolchain.model import Toolchain
from warmup.toolchain.probes import current_toolchain


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Spec:
    """An SFT spec of two training shapes, train 2x32 and train 2x64."""
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    spec = load_spec(
        {
            "trainer": "sft",
            "model": str(model),
            "args": {
                "per_device_train_batch_size": 2,
                "max_length": 64,
                "pad_to_multiple_of": 32,
                "torch_compile": True,
                "bf16": False,
            },
            "data": {"min_tokens": 10, "max_tokens": 64},
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    shapes = sorted((s.phase, s.batch, s.seq_len) for s in plan_spec(spec).signatures)
    assert shapes == [("train", 2, 32), ("train", 2, 64)]
    return spec


@pytest.fixture(scope="module")
def exact() -> Toolchain:
    return current_toolchain("inductor", "cpu")


def pulled_into(dest: Path, spec: Spec, toolchain: Toolchain, warmed: list[Signature]) -> Path:
    """`dest` as a pull of `spec` leaves it: its local manifest, for `toolchain`, holding `warmed`."""
    dest.mkdir(parents=True, exist_ok=True)
    planned = plan_spec(spec).signatures
    manifest = Manifest(
        spec_key=spec.key(),
        toolchain_key=toolchain.key(),
        toolchain=toolchain.model_dump(mode="json"),
        backend="inductor",
        device="cpu",
        plan_size=len(planned),
        signatures=[s.key() for s in warmed],
        missing=[s.key() for s in planned if s not in warmed],
        files=[],
    )
    save_local_manifest(dest, manifest)
    return dest


def signature_of(spec: Spec, seq_len: int) -> Signature:
    return next(s for s in plan_spec(spec).signatures if s.seq_len == seq_len)


# --- the remembered facts are stale: the training process refuses the cache, naming the field ---------


# A CPU of the same ISA whose compiler builds for another CPU (`-march=native` resolved there): one extension
# less than this machine has, another tuning.
OTHER_CPU = "another CPU target"


@pytest.mark.parametrize(
    ("field", "stale"),
    [
        ("torch_key", "0" * 64),
        ("cpu_isa", ("avx512 avx512_vnni amx_tile", "avx2")),
        ("cpu_target", OTHER_CPU),
    ],
    ids=["another torch build", "another ISA", "another native target"],
)
def test_a_cache_pulled_for_stale_remembered_facts_is_refused_naming_the_field(
    spec, exact, tmp_path, monkeypatch, field, stale
):
    """The image's memo says this install is another torch build (or this machine another ISA, or a CPU that
    -march=native builds other code for): the pod trusts it, pulls the cache of those facts from the
    bucket, and the training process, which computes the exact facts, refuses that cache naming the field,
    reports it, and corrects the memo."""
    from warmup.client.pulling import pull
    from warmup.db.manifests import publish_manifest
    from warmup.pod.activation import activate
    from warmup.pod.callback.observer import WarmupCallback
    from warmup.store import LocalBlobStore
    from warmup.toolchain.memo import remember_in_image, resolve_toolchain

    memo = tmp_path / "image-memo.json"
    monkeypatch.setenv("WARMUP_TOOLCHAIN_MEMO", str(memo))
    remember_in_image(exact)  # `warmup toolchain --remember` in the image build ...
    if isinstance(stale, tuple):  # an ISA other than this machine's own (which may be either)
        stale = next(isa for isa in stale if isa != exact.cpu_isa)
    difference = (getattr(exact, field), stale)  # (here, pulled for)
    if stale == OTHER_CPU:
        assert exact.cpu_target is not None
        dropped = next(option for option in exact.cpu_target if option.startswith("-m") and "=" not in option)
        tune = next(option for option in exact.cpu_target if option.startswith("-mtune="))
        other_tune = (
            "-mtune=skylake" if tune == "-mtune=generic" else "-mtune=generic"
        )  # this CPU's may be either
        stale = tuple(sorted({*exact.cpu_target} - {dropped, tune} | {other_tune}))
        difference = ([dropped, tune], [other_tune])  # named: what each side has alone
    wrong = exact.model_copy(update={field: stale})
    data = json.loads(memo.read_text())  # ... then the facts went stale (here: made so)
    for machines in data["exact"].values():
        for key in machines:
            machines[key] = wrong.model_dump(mode="json")
    memo.write_text(json.dumps(data))
    assert resolve_toolchain("inductor", "cpu") == (wrong, "exact")

    store = LocalBlobStore(tmp_path / "bucket")  # a bucket that holds a cache for the stale facts
    publish_manifest(
        store,
        Manifest(
            spec_key=spec.key(),
            toolchain_key=wrong.key(),
            toolchain=wrong.model_dump(mode="json"),
            backend="inductor",
            device="cpu",
            plan_size=2,
            signatures=[s.key() for s in plan_spec(spec).signatures],
            files=[],
        ),
    )
    dest = tmp_path / "cache"
    result = pull(spec, dest, source=str(tmp_path / "bucket"))
    assert result.toolchain_source == "exact" and result.manifest.toolchain_key == wrong.key()

    with pytest.raises(ToolchainMismatchError) as refused:
        activate(spec, dest)
    assert set(refused.value.differences) == {field}
    assert tuple(refused.value.differences[field]) == tuple(difference)
    assert "refused" in str(refused.value) and field in str(refused.value)

    callback = WarmupCallback(spec, cache_dir=dest)
    out = tmp_path / "out"
    with pytest.raises(ToolchainMismatchError, match=field):
        callback.on_init_end(SimpleNamespace(output_dir=str(out)), None, None)
    report = json.loads((out / "warmup-coverage.json").read_text())
    assert report["details"]["status"] == "refused"
    assert report["details"]["toolchain_mismatch"] == {
        field: {"here": difference[0], "pulled": difference[1]}
    }

    # The exact facts replaced the stale ones: the next pod's toolchain is right.
    assert resolve_toolchain("inductor", "cpu")[0] == exact
    assert resolve_toolchain("inductor", "cpu", directory=dest)[0] == exact  # the pull's memo too


def test_a_cache_pulled_for_the_exact_facts_is_used(spec, exact, tmp_path):
    from warmup.pod.activation import activate, verify_pulled_toolchain

    dest = pulled_into(tmp_path / "cache", spec, exact, plan_spec(spec).signatures)
    check = verify_pulled_toolchain(dest, spec)
    assert check is not None and check.differences == {}
    assert activate(spec, dest).cache_dir == dest.absolute()
    assert verify_pulled_toolchain(tmp_path / "never-pulled", spec) is None


# --- strict: a run that meets an unwarmed shape stops before compiling it -----------------------------


def embedding_model():  # a module whose input is (batch, seq_len) token ids, as a causal LM's
    import torch

    return torch.nn.Embedding(100, 4).train()


def test_strict_stops_at_the_first_unwarmed_shape_naming_it_and_the_nearest_warmed_entry(
    spec, exact, tmp_path
):
    import torch

    from warmup.pod.callback.observer import WarmupCallback

    dest = pulled_into(tmp_path / "cache", spec, exact, [signature_of(spec, 32)])
    out = tmp_path / "out"
    args = SimpleNamespace(output_dir=str(out), bf16=False, fp16=False)
    callback = WarmupCallback(spec, cache_dir=dest, strict=True)
    model = embedding_model()
    callback.on_init_end(args, None, None)
    callback.on_train_begin(args, SimpleNamespace(global_step=0), None, model=model)

    ran = model(torch.zeros(2, 32, dtype=torch.long))  # warmed: runs
    assert ran.shape == (2, 32, 4)
    with pytest.raises(UnwarmedCompileError) as stopped:
        model(torch.zeros(2, 64, dtype=torch.long))  # planned, not in the cache: stops before running
    message = str(stopped.value)
    assert "train 2x64 was not warmed" in message and "nearest warmed entry: train 2x32" in message
    assert "seq_len 32 warmed vs 64 here" in message and "--allow-partial" in message
    report = json.loads((out / "warmup-coverage.json").read_text())
    assert report["details"]["status"] == "refused" and report["details"]["refused"] == "train 2x64"
    assert report["details"]["strict"] is True
    assert [m["seq_len"] for m in report["missed"]] == [64]  # the service warms it for the next run
    why = report["details"]["why"]["train 2x64"]
    assert why["nearest"] == "train 2x32" and why["differs"] == {"seq_len": {"warmed": 32, "run": 64}}
    assert why["planned"] is True and why["warmed"] is False


def test_without_strict_the_same_run_goes_on(spec, exact, tmp_path):
    import torch

    from warmup.pod.callback.observer import WarmupCallback

    dest = pulled_into(tmp_path / "cache", spec, exact, [signature_of(spec, 32)])
    args = SimpleNamespace(output_dir=str(tmp_path / "out"), bf16=False, fp16=False)
    callback = WarmupCallback(spec, cache_dir=dest, strict=False)
    model = embedding_model()
    callback.on_init_end(args, None, None)
    callback.on_train_begin(args, SimpleNamespace(global_step=0), None, model=model)
    assert model(torch.zeros(2, 64, dtype=torch.long)).shape == (2, 64, 4)
    assert read_local_manifest(dest, spec.key()) is not None
    report = callback.report("completed")  # no server: not posted, written
    assert report is None and callback.last_report is not None
    assert callback.last_report["details"]["shapes"]["train 2x64"] == {"step": 0, "compiled": False}


def test_strict_refuses_a_directory_no_pull_filled(spec, tmp_path):
    from warmup.pod.callback.observer import WarmupCallback

    callback = WarmupCallback(spec, cache_dir=tmp_path / "empty", strict=True)
    with pytest.raises(UnwarmedCompileError, match="no cache of this spec was pulled"):
        callback.on_init_end(SimpleNamespace(output_dir=str(tmp_path / "out")), None, None)


def test_strict_comes_from_the_environment_warmup_exec_sets(spec, monkeypatch):
    from warmup.pod.callback.observer import WarmupCallback

    monkeypatch.setenv("WARMUP_STRICT", "1")
    assert WarmupCallback(spec).strict is True
    assert WarmupCallback(spec, strict=False).strict is False
    monkeypatch.delenv("WARMUP_STRICT")
    assert WarmupCallback(spec).strict is False


# --- why a compile happened ------------------------------------------------------------------------


def test_a_planned_and_warmed_shape_that_compiled_names_what_differs_from_the_spec(spec):
    train_32, train_64 = signature_of(spec, 32), signature_of(spec, 64)
    planned_gc = train_32.gradient_checkpointing
    ran = RunFacts(dtype="bfloat16", autocast=None, gradient_checkpointing=not planned_gc, frozen=False)
    diagnosis = diagnose(("train", 2, 32), train_32, [train_32, train_64], ran, planned=True)
    assert diagnosis.nearest == "train 2x32" and diagnosis.warmed
    assert diagnosis.differs == {
        "dtype": ("float32", "bfloat16"),
        "gradient_checkpointing": (planned_gc, not planned_gc),
    }
    assert "the run's model differs from the spec's (dtype, gradient_checkpointing)" in diagnosis.cause
    frozen = diagnose(("train", 2, 32), train_32, [train_32], RunFacts(frozen=True), planned=True)
    assert frozen.differs == {
        "frozen": (False, True)
    }  # trainable set: the spec has no PEFT, the run froze some


def test_an_unplanned_shape_names_the_nearest_warmed_entry_and_the_plan(spec):
    train_32, train_64 = signature_of(spec, 32), signature_of(spec, 64)
    derived = train_64.model_copy(update={"seq_len": 96})
    diagnosis = diagnose(("train", 2, 96), derived, [train_32, train_64], RunFacts(), planned=False)
    assert diagnosis.nearest == "train 2x64" and diagnosis.differs == {"seq_len": (64, 96)}
    assert not diagnosis.warmed and "the plan did not list this shape" in diagnosis.cause


def test_a_toolchain_difference_is_named_as_the_environment(spec):
    train_32 = signature_of(spec, 32)
    diagnosis = diagnose(
        ("train", 2, 32),
        train_32,
        [train_32],
        RunFacts(),
        planned=True,
        toolchain_differences={"cpu_isa": ("avx2", "avx512")},  # (here, pulled for)
    )
    assert diagnosis.differs == {"toolchain.cpu_isa": ("avx512", "avx2")}
    assert "the environment differs" in diagnosis.cause


def test_the_callbacks_warning_says_why(spec, exact, tmp_path, caplog):
    """A planned shape the cache holds that still compiled: the warning names the fields that differ."""
    from warmup.pod.callback.observer import WarmupCallback

    dest = pulled_into(tmp_path / "cache", spec, exact, plan_spec(spec).signatures)
    callback = WarmupCallback(spec, cache_dir=dest)
    callback.on_init_end(SimpleNamespace(output_dir=None), None, None)
    callback._facts = RunFacts(dtype="bfloat16")  # as on_train_begin reads it from a bf16 model
    with caplog.at_level(logging.WARNING, logger="warmup.pod.callback"):
        callback._warn_once(("train", 2, 64))
    assert (
        "although the cache in" in caplog.text and "dtype 'float32' warmed vs 'bfloat16' here" in caplog.text
    )
    report = callback.build_report("completed")
    assert report["details"]["why"]["train 2x64"]["differs"] == {
        "dtype": {"warmed": "float32", "run": "bfloat16"}
    }


def test_exec_makes_inductors_key_tag_from_exact_toolchain_facts_and_computes_it_for_predicted_ones(
    spec, exact, tmp_path, monkeypatch
):
    """`warmup exec` sets TORCH_COMPILE_CACHE_KEY_TAG (the CPU ISA and thread count) for the training
    process. From facts the pull holds exactly it is the tag this machine computes, without torch;
    from predicted facts it is computed, so a wrong prediction cannot select code built for another ISA."""
    from warmup.backends.inductor import InductorBackend
    from warmup.pod.training_env import training_process_environment

    computed_tag = InductorBackend("cpu").key_tag()
    dest = pulled_into(tmp_path / "cache", spec, exact, [])
    manifest = read_local_manifest(dest, spec.key())
    assert manifest is not None
    for source in ("computed", "exact", "remembered", "predicted", ""):
        env = training_process_environment(manifest, dest, 1, source)
        assert env["TORCH_COMPILE_CACHE_KEY_TAG"] == computed_tag, source
    wrong = pulled_into(tmp_path / "other", spec, exact.model_copy(update={"cpu_isa": "avx512"}), [])
    wrong_manifest = read_local_manifest(wrong, spec.key())
    assert wrong_manifest is not None
    assert (
        "isa=avx512;"
        in training_process_environment(wrong_manifest, wrong, 1, "exact")["TORCH_COMPILE_CACHE_KEY_TAG"]
    )
    assert (
        training_process_environment(wrong_manifest, wrong, 1, "predicted")["TORCH_COMPILE_CACHE_KEY_TAG"]
        == computed_tag
    )


def test_exec_and_activate_set_vllms_cache_for_a_colocate_job_and_only_for_it(
    spec, exact, tmp_path, monkeypatch
):
    """One rule for where vLLM's compile cache is (`vllm_environment`): `warmup exec` (and `--print-env`) set it
    for the training command as `warmup.activate` sets it in the process."""
    from warmup.pod.activation import activate
    from warmup.pod.training_env import child_environment, vllm_environment

    dest = pulled_into(tmp_path / "cache", spec, exact, plan_spec(spec).signatures)
    manifest = read_local_manifest(dest, spec.key())
    colocate = spec.model_copy(update={"args": {**spec.args, "use_vllm": True}})
    server = spec.model_copy(update={"args": {**spec.args, "use_vllm": True, "vllm_mode": "server"}})
    pulled = SimpleNamespace(manifest=manifest, dest=dest, toolchain_source="exact")
    assert child_environment(colocate, pulled)["VLLM_CACHE_ROOT"] == str(dest / "vllm")
    for other in (spec, server):
        assert "VLLM_CACHE_ROOT" not in child_environment(other, pulled)
        assert vllm_environment(other.args, dest) == {}

    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    activation = activate(colocate, dest, plan_size=2, check_toolchain=False)
    assert activation.env["VLLM_CACHE_ROOT"] == os.environ["VLLM_CACHE_ROOT"] == str(dest.absolute() / "vllm")
