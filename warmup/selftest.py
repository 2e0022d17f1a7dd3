"""`warmup selftest`: the zero-compile proof, run on this machine's own hardware in a few minutes.

It writes a tiny model (a 2-layer Qwen3 config, a word-level tokenizer and random weights: nothing
is downloaded) and, for each of two small TRL jobs, plans the job, warms it into a fresh cache
directory with `warmup.rehearsal.local.warm_directory` (the job's own TRL trainer on synthetic data,
in the rehearsal's processes), then trains it in a fresh process the way a training pod does:
`warmup.activate(spec, cache_dir)` and `WarmupCallback` first, then the job's trainer with other
weights and other data. That process reports what it still compiled and which signatures it met.

Phases, and the job that proves them:
- train: the policy's forward and backward (a DPO job);
- ref: the reference model's forward, compiled too (the same DPO job);
- generation: generating with a static KV cache, a prefill and one decode step per token (a GRPO job).

Verdicts: `pass` (every planned signature of the phase was met, and the job compiled nothing),
`FAIL` (the job compiled something, a signature was never met, or the warm-up failed), and
`nothing to compile` (the plan labels every signature of the phase eager on this backend, as
generation is under Inductor because TRL generates with `disable_compile=True`; they were met,
and the job compiled nothing). Library entry point: `run_selftest(backend, device)`.

TorchNeuron: the `neuron` backend follows the same steps with `torch_compile_backend: neuron`; it is
written against TorchNeuron's documented behaviour and has not been run on Trainium by this project.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmup.errors import SpecError, WarmupError
from warmup.formatting import format_duration
from warmup.trainers.registry import family

VERDICT_PASS, VERDICT_FAIL, VERDICT_NOTHING = "pass", "FAIL", "nothing to compile"
TRAIN_STEPS = 2
DATA_SEED = 7  # the training process's data and weights are not the warm-up's
WEIGHTS_SEED = 1234
LOG_TAIL_CHARS = 3000


@dataclasses.dataclass(frozen=True)
class SelftestJob:
    """A small TRL job and the phases it proves: {phase: the signature phases its verdict is about}."""

    trainer: str
    args: dict[str, Any]
    data: dict[str, Any]
    phases: dict[str, tuple[str, ...]]


# Tiny shapes: one padded width per job, so that each warms one training step.
JOBS = (
    # the policy's forward and backward, and the reference model's forward (compiled too)
    SelftestJob(
        "dpo",
        {"per_device_train_batch_size": 2, "max_length": 32, "pad_to_multiple_of": 32},
        {"num_train_examples": 2 * TRAIN_STEPS, "min_tokens": 12, "max_tokens": 32},
        {"train": ("train",), "ref": ("ref",)},
    ),
    # generation with a static KV cache: a prefill and one decode step per token
    SelftestJob(
        "grpo",
        {
            "per_device_train_batch_size": 2,
            "num_generations": 2,
            "max_completion_length": 8,
            "pad_to_multiple_of": 16,
            "cache_implementation": "static",
            "generation_kwargs": {"max_cache_len": 24},
            "beta": 0.0,
        },
        {"min_prompt_tokens": 4, "max_prompt_tokens": 16},
        {"generation": ("generate_prefill", "generate_decode")},
    ),
)
PHASES = tuple(phase for job in JOBS for phase in job.phases)


@dataclasses.dataclass
class PhaseResult:
    phase: str
    trainer: str  # the job that proves it
    signatures: list[str]  # the phase's planned signatures (shape labels)
    verdict: str = VERDICT_FAIL
    detail: str = ""
    met: list[str] = dataclasses.field(default_factory=list)  # those the training process met
    # the training process's fresh compiles by kind (new_files: a count); empty: it did not train
    fresh: dict[str, int] = dataclasses.field(default_factory=dict)
    warm_seconds: float = 0.0  # the job's, shared by the phases it proves
    train_seconds: float = 0.0
    # Dynamo's trace time in the warmed training process (what the backend's caches cannot spare; on
    # TorchNeuron every phase is traced again before its NEFF is found); None: not measured
    trace_seconds: float | None = None

    @property
    def fresh_total(self) -> int:
        return sum(self.fresh.values())


@dataclasses.dataclass
class SelftestReport:
    backend: str
    device: str
    toolchain: str
    work_dir: Path
    phases: list[PhaseResult]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(result.verdict != VERDICT_FAIL for result in self.phases)


def default_device(backend: str) -> str:
    """neuron for the neuron backend; for Inductor cuda when torch sees a GPU, else cpu."""
    if backend == "neuron":
        return "neuron"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def job_spec(job: SelftestJob, model: Path, backend: str, device: str) -> dict[str, Any]:
    """The job's spec: fp32 everywhere (an autocast region bypasses AOTAutograd's cache on torch 2.13)."""
    args: dict[str, Any] = {
        "torch_compile": True,
        "bf16": False,
        "gradient_checkpointing": False,
        **job.args,
    }
    if device == "cpu":
        args["use_cpu"] = True
    if backend == "neuron":
        args["torch_compile_backend"] = "neuron"
    return {
        "trainer": job.trainer,
        "model": str(model),
        "args": args,
        "data": job.data,
        "target": {"backend": backend, "device": device, "world_size": 1},
    }


def run_selftest(
    backend: str = "inductor",
    device: str | None = None,
    *,
    phases: tuple[str, ...] = PHASES,
    work_dir: str | os.PathLike[str] | None = None,
    keep: bool = False,
    timeout_s: float = 900.0,
    on_line: Callable[[str], None] | None = None,
) -> SelftestReport:
    """Plan, warm and train the jobs of `phases` here; a verdict per phase. `on_line` gets progress lines.

    The work directory (default: a new temporary one) is removed at the end unless `keep` is set or
    a phase failed (its logs are there). Raises SpecError for an unknown phase or backend/device pair.
    """
    from warmup.backends.registry import get_backend
    from warmup.tiny_model import save_weights, write_tiny_model

    say = on_line or (lambda line: None)
    unknown = [phase for phase in phases if phase not in PHASES]
    if unknown or not phases:
        raise SpecError(f"unknown phase(s) {unknown}: choose from {', '.join(PHASES)}", loc="phases")
    device = device or default_device(backend)
    get_backend(backend, device)  # refuses a backend/device pair that does not go together
    start = time.perf_counter()
    work = Path(work_dir or tempfile.mkdtemp(prefix="warmup-selftest-")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    model = write_tiny_model(work / "model")
    weights = save_weights(model, work / "weights", seed=WEIGHTS_SEED)
    say(f"work dir {work}")
    results: list[PhaseResult] = []
    toolchain = f"{backend}/{device}"
    for job in JOBS:
        wanted = [phase for phase in job.phases if phase in phases]
        if not wanted:
            continue
        run = _run_job(job, work / job.trainer, model, weights, backend, device, timeout_s, say)
        toolchain = run.toolchain or toolchain
        for phase in wanted:
            results.append(run.judge(phase, job.phases[phase], backend))
            say(format_row(results[-1]))
    report = SelftestReport(backend, device, toolchain, work, results, time.perf_counter() - start)
    if report.passed and not keep:
        shutil.rmtree(work, ignore_errors=True)
    return report


@dataclasses.dataclass
class JobRun:
    """What warming and training one job gave: its plan, times, and the training process's outcome."""

    trainer: str
    signatures: list[Any]
    warm_seconds: float = 0.0
    train_seconds: float = 0.0
    toolchain: str | None = None
    failure: str = ""  # why the job could not be judged (the warm-up or the training process failed)
    fresh: dict[str, int] = dataclasses.field(default_factory=dict)
    met: set[tuple[Any, ...]] = dataclasses.field(default_factory=set)  # (phase, batch, seq_len)
    trace_seconds: float | None = None

    def judge(self, phase: str, signature_phases: tuple[str, ...], backend: str) -> PhaseResult:
        judged = [s for s in self.signatures if s.phase in signature_phases]
        result = PhaseResult(phase, self.trainer, [s.shape_label for s in judged])
        result.warm_seconds, result.train_seconds = self.warm_seconds, self.train_seconds
        result.trace_seconds = self.trace_seconds
        if self.failure:
            result.detail = self.failure
            return result
        result.fresh = dict(self.fresh)
        result.met = [s.shape_label for s in judged if (s.phase, s.batch, s.seq_len) in self.met]
        result.verdict, result.detail = judge(judged, result.met, result.fresh, backend)
        return result


def _run_job(
    job: SelftestJob,
    directory: Path,
    model: Path,
    weights: Path,
    backend: str,
    device: str,
    timeout_s: float,
    say: Callable[[str], None],
) -> JobRun:
    from warmup.job.spec import Spec
    from warmup.planner.planning import plan_spec
    from warmup.rehearsal.local import warm_directory

    directory.mkdir(parents=True, exist_ok=True)
    spec_data = job_spec(job, model, backend, device)
    spec_path = directory / "job.json"
    spec_path.write_text(json.dumps(spec_data, indent=1))
    spec = Spec.model_validate(spec_data)
    run = JobRun(job.trainer, plan_spec(spec).signatures)
    say(f"{job.trainer}: warming {', '.join(s.shape_label for s in run.signatures)}")

    cache = directory / "cache"
    began = time.perf_counter()
    report = warm_directory(
        spec, cache, timeout_s=timeout_s, work_dir=directory / "warm-work", keep_work=True
    )
    run.warm_seconds = time.perf_counter() - began
    run.toolchain = _toolchain_line(cache)
    failed = [r for r in report.results if r.status != "ok"]
    if failed:
        first = failed[0]
        run.failure = f"warm-up {first.status} for {first.signature.shape_label}: {first.note}"
        (directory / "warm-failure.log").write_text(first.log_tail)
        return run

    say(f"{job.trainer}: training in a fresh process over the warmed cache")
    began = time.perf_counter()
    outcome = _train_fresh(directory, spec_path, cache, weights, timeout_s)
    run.train_seconds = time.perf_counter() - began
    if "error" in outcome:
        run.failure = f"the training process failed: {outcome['error']}"
        return run
    run.fresh = {name: int(count) for name, count in outcome["fresh"].items()}
    run.met = {tuple(shape) for shape in outcome["met"]}
    timings = outcome.get("timings") or {}
    run.trace_seconds = timings.get("trace_s")
    return run


def judge(judged: list[Any], met: list[str], fresh: dict[str, int], backend: str) -> tuple[str, str]:
    """The verdict of one phase from its planned signatures, those met, and the job's fresh compiles."""
    compiled = sum(fresh.values())
    if compiled:
        kinds = ", ".join(f"{name} {count}" for name, count in sorted(fresh.items()) if count)
        return VERDICT_FAIL, f"the training process compiled: {kinds}"
    if not judged:
        return VERDICT_FAIL, "the plan lists no signature of this phase: nothing was proven"
    unmet = [s.shape_label for s in judged if s.shape_label not in met]
    if unmet:
        return VERDICT_FAIL, f"planned but never met in training: {', '.join(unmet)} (no proof for them)"
    if all(signature.compile == "eager" for signature in judged):
        return (
            VERDICT_NOTHING,
            f"{backend} runs this phase eager (the plan says so); met, and the job compiled nothing",
        )
    return VERDICT_PASS, f"{len(met)} signature(s) met, nothing compiled"


def _toolchain_line(cache: Path) -> str | None:
    from warmup.pod.activation import read_manifest
    from warmup.toolchain.model import Toolchain

    manifest = read_manifest(cache) or {}
    if not manifest.get("toolchain"):
        return None
    return Toolchain.model_validate(manifest["toolchain"]).short


def _train_fresh(directory: Path, spec: Path, cache: Path, weights: Path, timeout_s: float) -> dict[str, Any]:
    """Run the phase's training job in a new interpreter; its outcome, or {"error": ...}."""
    from warmup.rehearsal.runner import _child_env

    out = directory / "train.json"
    log = directory / "train.log"
    command = [sys.executable, "-m", "warmup.selftest", str(spec), str(cache), str(weights), str(out)]
    with open(log, "wb") as handle:
        try:
            done = subprocess.run(
                command, stdout=handle, stderr=subprocess.STDOUT, env=_child_env(), timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {timeout_s:.0f} s; its log: {log}"}
    if done.returncode != 0 or not out.is_file():
        tail = log.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
        return {"error": f"exit code {done.returncode}; its log ({log}) ends:\n{tail}"}
    outcome: dict[str, Any] = json.loads(out.read_text())
    return outcome


# --- the training process ---------------------------------------------------------------------------


def train_main(argv: list[str]) -> int:
    """`python -m warmup.selftest SPEC CACHE_DIR WEIGHTS OUT`: train the phase's job as a pod would."""
    spec_path, cache, weights, out = argv
    import warmup
    from warmup.job.spec import load_spec

    spec = load_spec(Path(spec_path))
    activation = warmup.activate(spec, cache_dir=cache)
    from warmup.pod.callback.observer import WarmupCallback

    callback = WarmupCallback(spec, cache_dir=cache)
    trainer = _user_trainer(spec, Path(weights), Path(out).parent / "trainer-out", callback)
    trainer.train()
    fresh = activation.fresh_compiles()
    report = callback.last_report or callback.build_report("completed")
    met = [_shape(label) for label in report["details"]["shapes"]]
    result = {
        "fresh": {**dict(fresh.counts), "new_files": len(fresh.new_files)},
        "met": met,
        "timings": report["details"].get("timings"),
    }
    Path(out).write_text(json.dumps(result))
    return 0


def _shape(label: str) -> list[Any]:
    phase, dims = label.rsplit(" ", 1)
    batch, seq_len = dims.split("x")
    return [phase, int(batch), int(seq_len)]


def _user_trainer(spec: Any, weights: Path, output_dir: Path, callback: Any) -> Any:
    """The phase's TRL trainer as a user writes it: the spec's config fields, own weights, own data."""
    import trl
    from datasets import Dataset

    from warmup.job.trl_args import config_class

    config = config_class(spec.trainer)(
        **spec.args,
        output_dir=str(output_dir),
        max_steps=TRAIN_STEPS,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
    )
    rng = random.Random(DATA_SEED)
    rows = config.per_device_train_batch_size * TRAIN_STEPS
    extra: dict[str, Any] = {}
    if spec.trainer == "sft":
        data = [
            {"text": _words(rng, spec.data.min_tokens - 1, spec.data.max_tokens - 1)} for _ in range(rows)
        ]
    elif spec.trainer == "dpo":
        data = [_preference(rng, spec.data.min_tokens, spec.data.max_tokens) for _ in range(rows)]
    elif spec.trainer == "grpo":
        prompts = config.generation_batch_size // config.num_generations * TRAIN_STEPS
        low, high = spec.data.min_prompt_tokens, spec.data.max_prompt_tokens
        data = [{"prompt": _words(rng, low, high)} for _ in range(prompts)]
        extra["reward_funcs"] = _length_reward
    else:
        raise WarmupError(f"the selftest has no job for trainer {spec.trainer!r}")
    return getattr(trl, family(spec.trainer).trainer_class)(
        model=str(weights),
        args=config,
        train_dataset=Dataset.from_list(data),
        callbacks=[callback],
        **extra,
    )


def _words(rng: random.Random, low: int, high: int) -> str:
    from warmup.tiny_model import words

    return words(rng.randint(low, high), offset=rng.randint(0, 199))


def _preference(rng: random.Random, low: int, high: int) -> dict[str, str]:
    # DPO appends EOS: a row is prompt + completion + 1 tokens, at most `high`
    prompt = rng.randint(2, low - 3)
    chosen, rejected = (rng.randint(low, high) - prompt - 1 for _ in range(2))
    return {
        "prompt": _words(rng, prompt, prompt),
        "chosen": " " + _words(rng, chosen, chosen),
        "rejected": " " + _words(rng, rejected, rejected),
    }


def _length_reward(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(str(completion))) for completion in completions]


# --- output -----------------------------------------------------------------------------------------


def format_fresh(result: PhaseResult) -> str:
    """`0`, or the total and its nonzero kinds; `-` when the job did not train."""
    if not result.fresh:
        return "-"
    kinds = ", ".join(f"{name} {count}" for name, count in sorted(result.fresh.items()) if count)
    return f"{result.fresh_total} ({kinds})" if kinds else "0"


def format_row(result: PhaseResult) -> str:
    return (
        f"{result.phase}: {result.verdict} ({result.trainer} job; warm {result.warm_seconds:.1f} s, "
        f"train {result.train_seconds:.1f} s, fresh compiles {format_fresh(result)}): {result.detail}"
    )


def format_report(report: SelftestReport) -> str:
    """The verdict table, then one summary line."""
    headers = ("phase", "job", "signatures", "met", "fresh compiles", "warm", "train", "trace", "verdict")
    rows = [
        (
            result.phase,
            result.trainer,
            ", ".join(result.signatures) or "-",
            f"{len(result.met)}/{len(result.signatures)}",
            format_fresh(result),
            f"{result.warm_seconds:.1f} s",
            f"{result.train_seconds:.1f} s",
            "-" if result.trace_seconds is None else f"{result.trace_seconds:.1f} s",
            result.verdict,
        )
        for result in report.phases
    ]
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    failed = [result.phase for result in report.phases if result.verdict == VERDICT_FAIL]
    took = format_duration(report.seconds)
    lines.append(
        "(warm and train: the job's, shared by the phases it proves; trace: Dynamo's trace time in the warmed "
        "training process)"
    )
    if failed:
        lines.append(f"\nselftest FAILED ({', '.join(failed)}) in {took}; logs in {report.work_dir}")
    else:
        lines.append(f"\nselftest passed in {took}: {report.toolchain}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(train_main(sys.argv[1:]))
