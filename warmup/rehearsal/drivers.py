"""The child side of a rehearsal: build the user's TRL trainer for one unit and run TRL's own step.

Runs inside a forked child, a `torchrun` rank or a plain subprocess, never in the caller's process.
What is the user's and what is rehearsal's:

- the trainer class, its config (every field the spec gives, resolved by TRL itself on this
  device), the model class and config, the tokenizer, the dtype, gradient checkpointing, the compile
  settings and the number of processes are the job's;
- weights are initialised from the model config instead of downloaded (`create_model_from_path` is
  replaced in TRL's trainer modules for the policy, the reference and the reward model alike, so
  TRL's own model-loading code path and kwargs still apply);
- settings that change no graph are overridden: max_steps 1, learning rate 0, no saving, no
  logging, no reporting, sequential sampling, output in the unit's work dir;
- the data is synthetic, built so that TRL's collators produce exactly the unit's batch shape;
  GRPO/RLOO generate a fixed number of tokens (min = max = the completion length) so that the
  training width is exact.

After the run the shapes TRL actually produced (collated batches, or the log-prob forwards of
GRPO/RLOO) are compared with the unit's; a mismatch fails the unit, so a wrong entry is never
published.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmup._compat import torch as compat_torch
from warmup._compat import transformers as compat_transformers
from warmup._compat import trl as compat_trl
from warmup.backends.registry import get_backend
from warmup.errors import MissingDependencyError, RehearsalError, WarmupError
from warmup.job.peft_args import lora_config
from warmup.job.spec import Spec
from warmup.job.trl_args import config_class
from warmup.job.trl_config import read_trl_args
from warmup.planner.sharding import check_launch
from warmup.pod.training_env import vllm_environment
from warmup.rehearsal.cpu_sharding import shard_on_cpu
from warmup.rehearsal.data import (
    TextMaker,
    kto_rows,
    padding_free_rows,
    preference_rows,
    prompt_rows,
    reward_rows,
    sft_rows,
)
from warmup.rehearsal.units import RehearsalUnit
from warmup.trace_skip.capture import start_recording
from warmup.trainers.record import TrainerFamily
from warmup.trainers.registry import family

# Where a colocate vLLM rehearsal keeps vLLM's own cache inside the cache directory (see vllm_rehearsable).
# Loading arguments of from_pretrained that from_config does not take; the rest configure the model.
LOADING_ONLY_KWARGS = (
    "device_map",
    "revision",
    "low_cpu_mem_usage",
    "use_safetensors",
    "subfolder",
    "cache_dir",
)


@dataclass
class RunJob:
    """Everything one rehearsal process needs: the job, its units (run as consecutive steps), dirs."""

    spec: Spec
    units: list[RehearsalUnit]
    cache_dir: Path
    work_dir: Path
    plan_size: int

    @property
    def unit(self) -> RehearsalUnit:
        """The first (for an evaluation: the only) unit of the run."""
        return self.units[0]

    def to_json(self) -> str:
        return json.dumps(
            {
                "spec": self.spec.model_dump(mode="json"),
                "units": [unit.model_dump(mode="json") for unit in self.units],
                "cache_dir": str(self.cache_dir),
                "work_dir": str(self.work_dir),
                "plan_size": self.plan_size,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RunJob:
        data = json.loads(text)
        return cls(
            spec=Spec.model_validate(data["spec"]),
            units=[RehearsalUnit.model_validate(unit) for unit in data["units"]],
            cache_dir=Path(data["cache_dir"]),
            work_dir=Path(data["work_dir"]),
            plan_size=int(data["plan_size"]),
        )


@dataclass
class Observed:
    """Shapes the trainer produced during the run."""

    batches: list[tuple[int, ...]] = field(default_factory=list)
    forwards: list[tuple[int, ...]] = field(default_factory=list)
    prompt_widths: list[int] = field(default_factory=list)
    kl_batches: list[tuple[int, ...]] = field(default_factory=list)  # KTO's KL rows


class _EvaluationDone(Exception):
    """Raised from a callback to leave train() right after the evaluation a rehearsal came for."""


# --- entry point ---------------------------------------------------------------------------------


def run(job: RunJob, progress: Path | None = None) -> dict[str, Any]:
    """Rehearse a run's units in this process; returns the outcome, one entry per unit.

    Train units run as consecutive optimizer steps of one train() (step k produces unit k), so a
    run of several units costs what a cold training run spends compiling those shapes. `progress`,
    if given, receives the number of finished steps as each one ends.
    """
    start = time.perf_counter()
    backend = get_backend(job.spec.target.backend, job.spec.target.device)
    # Before anything compiles: the same settings warmup.activate() applies in a training process.
    backend.configure_process(job.cache_dir, job.plan_size)
    counter = backend.counter(job.cache_dir)
    # each backbone call is also kept traced, one process or DDP's several (warmup/trace_skip/; on Neuron unverified)
    recorder = start_recording(_world_size(), job.unit.signatures[0].sharding)
    use_weights_from_config()
    trainer, observed = build_trainer(job)
    steps = StepAccounts(job, trainer, observed, progress)
    trainer.add_callback(steps.callback())
    if job.unit.kind == "train":
        trainer.train()
    else:
        evaluate_as_in_training(trainer)
        steps.close_evaluation()
    if len(steps.accounts) != len(job.units):
        raise RehearsalError(f"the run finished {len(steps.accounts)} of {len(job.units)} steps")
    units = {}
    for unit, account in zip(job.units, steps.accounts, strict=True):
        check_shapes(job.spec.trainer, unit, account)
        units[str(unit.index)] = {
            "compile_seconds": round(account.compile_seconds, 3),
            "seconds": round(account.seconds, 3),
            "observed": {
                "batches": account.batches,
                "forwards": account.forwards,
                "prompts": account.prompts,
                "kl_batches": account.kl_batches,
            },
        }
    fresh = counter.fresh()
    trace = recorder.capture(job.cache_dir, exact=job.spec.target.device == "cpu")
    return {
        "status": "ok",
        "units": units,
        "trace": [dataclasses.asdict(outcome) for outcome in trace],
        "trace_lost": recorder.lost(),
        "compile_seconds": round(dynamo_compile_seconds(), 3),
        "run_seconds": round(time.perf_counter() - start, 3),
        "fresh_compiles": {**dict(fresh.counts), "new_files": len(fresh.new_files)},
    }


@dataclass
class StepAccount:
    """What one step (one unit) did: its compile time, wall time and the shapes TRL produced."""

    compile_seconds: float
    seconds: float
    batches: list[tuple[int, ...]]
    forwards: list[tuple[int, ...]]
    prompts: list[int]
    kl_batches: list[tuple[int, ...]] = field(default_factory=list)


class StepAccounts:
    """Splits a run into its units at step boundaries, and sets each GRPO/RLOO step's generation length.

    Shapes are recorded where TRL uses them (the loss, the log-prob forwards, generation), so a
    step's shapes are those recorded since the previous step ended.
    """

    def __init__(self, job: RunJob, trainer: Any, observed: Observed, progress: Path | None) -> None:
        self.job, self.trainer, self.observed, self.progress = job, trainer, observed, progress
        self.accounts: list[StepAccount] = []
        self._marks = (0, 0, 0, 0)
        self._compile_start = 0.0
        self._start = time.perf_counter()

    def callback(self) -> Any:
        from transformers import TrainerCallback

        accounts = self

        class Steps(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                accounts.begin(state.global_step)

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                accounts.end()

        return Steps()

    def begin(self, step: int) -> None:
        if step >= len(self.job.units):
            raise RehearsalError(f"the run went past its {len(self.job.units)} step(s)")
        if family(self.job.spec.trainer).generates:
            _fix_generation_length(self.trainer, self.job.units[step])
        self._compile_start = dynamo_compile_seconds()
        self._start = time.perf_counter()

    def end(self) -> None:
        observed, (batches, forwards, prompts, kl_batches) = self.observed, self._marks
        self.accounts.append(
            StepAccount(
                compile_seconds=dynamo_compile_seconds() - self._compile_start,
                seconds=time.perf_counter() - self._start,
                batches=observed.batches[batches:],
                forwards=observed.forwards[forwards:],
                prompts=observed.prompt_widths[prompts:],
                kl_batches=observed.kl_batches[kl_batches:],
            )
        )
        self._marks = (
            len(observed.batches),
            len(observed.forwards),
            len(observed.prompt_widths),
            len(observed.kl_batches),
        )
        if self.progress is not None:
            self.progress.write_text(str(len(self.accounts)))

    def close_evaluation(self) -> None:
        """An evaluation has no step: the whole run is its one account."""
        self._compile_start = 0.0
        self.end()


def run_to_file(job: RunJob, result_path: Path, *, rank: int = 0, progress: Path | None = None) -> int:
    """Run, write the outcome (rank 0 only) and return an exit code; never raises."""
    try:
        outcome = run(job, progress)
        code = 0
    except BaseException as error:  # a rehearsal failure of any kind is this run's result, not a crash
        if isinstance(error, KeyboardInterrupt):
            raise
        traceback.print_exc()
        message = str(error) if isinstance(error, WarmupError) else f"{type(error).__name__}: {error}"
        outcome = {"status": "failed", "error": message, "permanent": isinstance(error, ShapesNotProduced)}
        code = 1
    if rank == 0:
        temp = result_path.with_suffix(".partial")
        temp.write_text(json.dumps(outcome))
        temp.replace(result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def dynamo_compile_seconds() -> float:
    """Seconds Dynamo spent compiling in this process (frames, plus lazily compiled backwards)."""
    return compat_torch.dynamo_compile_seconds()


# --- models without weights ----------------------------------------------------------------------


def use_weights_from_config() -> None:
    """Make TRL's trainers build every model from its config (random weights) instead of loading weights."""
    compat_trl.build_models_with(model_from_config)


def model_from_config(model_id: str, architecture: Any = None, **kwargs: Any) -> Any:
    """TRL's `create_model_from_path` with the weights initialised from the config, not loaded.

    The same dtype rule and architecture choice as TRL; the model ends in eval mode like
    `from_pretrained` leaves it (the Trainer switches the policy to train mode itself).
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    if (
        kwargs.get("quantization_config") is not None
        or kwargs.get("load_in_4bit")
        or kwargs.get("load_in_8bit")
    ):
        raise RehearsalError("quantized models cannot be rehearsed (they do not compile under torch.compile)")
    dtype = kwargs.pop("dtype", "float32")
    if isinstance(dtype, str) and dtype in ("bfloat16", "float16", "float32"):
        dtype = getattr(torch, dtype)
    trust_remote_code = bool(kwargs.pop("trust_remote_code", False))
    attn_implementation = kwargs.pop("attn_implementation", None)
    use_kernels = kwargs.pop("use_kernels", False)
    revision = kwargs.get("revision")
    for name in LOADING_ONLY_KWARGS:
        kwargs.pop(name, None)
    config = AutoConfig.from_pretrained(
        model_id, trust_remote_code=trust_remote_code, revision=revision, **kwargs
    )
    if dtype in ("auto", None):
        dtype = getattr(config, "dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    if architecture is None:
        architectures = getattr(config, "architectures", None) or []
        architecture = getattr(transformers, architectures[0], None) if architectures else None
        architecture = architecture or AutoModelForCausalLM
    build_kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        build_kwargs["attn_implementation"] = attn_implementation
    model = compat_transformers.model_from_config(
        architecture, config, trust_remote_code=trust_remote_code, **build_kwargs
    )
    if use_kernels:
        raise RehearsalError("use_kernels (Hub kernels) cannot be rehearsed offline yet")
    # without a generation_config.json, from_pretrained derives it from the config, as from_config did
    with contextlib.suppress(OSError):
        model.generation_config = GenerationConfig.from_pretrained(model_id, revision=revision)
    model.eval()
    return model


# --- building the trainer ------------------------------------------------------------------------


REHEARSAL_OVERRIDES: dict[str, Any] = {
    "max_steps": 1,
    "learning_rate": 0.0,
    "save_strategy": "no",
    "logging_strategy": "no",
    "report_to": "none",
    "push_to_hub": False,
    "load_best_model_at_end": False,
    "dataloader_num_workers": 0,
    "dataset_num_proc": None,
    "disable_tqdm": True,
    "eval_on_start": False,
}


def build_config(job: RunJob) -> Any:
    """The job's TRL config with rehearsal's graph-neutral overrides, resolved by TRL on this device."""
    spec, unit = job.spec, job.unit
    cls = config_class(spec.trainer)
    known = {f.name for f in dataclasses.fields(cls)}
    overrides = {
        **REHEARSAL_OVERRIDES,
        "output_dir": str(job.work_dir / "trainer"),
        "max_steps": len(job.units),
        **family(spec.trainer).rehearsal_overrides,  # steps take their data in order: step k produces unit k
    }
    if unit.kind == "eval":
        overrides.update(eval_strategy="steps", eval_steps=1, eval_on_start=True)
    else:
        overrides["eval_strategy"] = "no"
    parsed = read_trl_args(spec, cls)  # the trainer's fields as `trl` reads them (no launcher keys, no env)
    if parsed.problems:
        raise RehearsalError("TRL refuses the job's config: " + "; ".join(str(p) for p in parsed.problems))
    launch = parsed.launch
    check_launch(spec, launch, bool(parsed.trainer.get("use_cpu")))
    if launch.distributed_type == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        raise MissingDependencyError(
            f"the job runs {launch.describe()}: warming it runs DeepSpeed, which this worker lacks: "
            "pip install 'trl-warmup[deepspeed]'"
        )
    if launch.distributed_type == "FSDP" and spec.target.device == "cpu":
        shard_on_cpu()  # accelerate sets up FSDP only on an accelerator: take that path with the CPU as the device
    kwargs = {**parsed.trainer, **{name: value for name, value in overrides.items() if name in known}}
    for name in ("deepspeed", "fsdp_config"):
        if isinstance(kwargs.get(name), str) and isinstance(spec.files.get(kwargs[name]), dict):
            kwargs[name] = spec.files[
                kwargs[name]
            ]  # the JSON the spec carries (TrainingArguments takes the dict)
    if launch.dynamo_backend and not kwargs.get("torch_compile"):
        # The launcher's dynamo config compiles every prepared module (accelerate reads ACCELERATE_DYNAMO_* when the
        # Trainer's plugin names no backend); torchrun has no launcher, so ask the Trainer for the same plugin.
        kwargs["torch_compile"] = True
        if launch.dynamo_mode:
            kwargs["torch_compile_mode"] = launch.dynamo_mode
    if kwargs.get("use_vllm") and not vllm_rehearsable(kwargs.get("vllm_mode", "colocate")):
        # The training graphs do not depend on who generated: generate through transformers instead.
        kwargs["use_vllm"] = False
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise RehearsalError(f"TRL refused the job's config on this machine: {error}") from None


def _refuse_old_logps_without_vllm(job: RunJob, config: Any) -> None:
    """With vLLM's importance-sampling correction GRPO computes old log-probs every round; generating through
    transformers it does so only when the accumulation asks. A compiled old_logps signature (Neuron) that the
    run would not produce must not be published as warmed."""
    compiled = any(s.phase == "old_logps" and s.compile != "eager" for u in job.units for s in u.signatures)
    generate_every = getattr(config, "steps_per_generation", 1) * getattr(config, "num_iterations", 1)
    if compiled and config.gradient_accumulation_steps % generate_every == 0:
        raise RehearsalError(
            "the job's old log-probs come from vLLM's importance-sampling correction, which a rehearsal without "
            "vLLM does not run: install vLLM on the worker (colocate mode) to warm them"
        )


def vllm_rehearsable(mode: str) -> bool:
    """Whether a rehearsal can run the job's vLLM generation itself: colocate mode, vLLM installed here.

    Then vLLM compiles in the rehearsal with VLLM_CACHE_ROOT inside the run's cache directory, so its
    `torch_compile_cache` joins the entry (written against vLLM's documented cache layout; unverified, no
    vLLM on the development machines). Server mode's cache belongs to the server's process.
    """
    return mode == "colocate" and importlib.util.find_spec("vllm") is not None


def build_trainer(job: RunJob) -> tuple[Any, Observed]:
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    spec = job.spec
    if job.unit.kind == "eval" and len(job.units) > 1:
        raise RehearsalError("an evaluation is rehearsed alone, one per run")
    config = build_config(job)
    if spec.args.get("use_vllm") and not getattr(config, "use_vllm", False):
        _refuse_old_logps_without_vllm(job, config)
    if getattr(config, "use_vllm", False):
        import os

        os.environ.update(vllm_environment(spec.args, job.cache_dir))  # where the job's processes look
    tokenizer = AutoTokenizer.from_pretrained(spec.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # what TRL does when the tokenizer has none
    world = _world_size()
    record = family(spec.trainer)
    train: list[dict[str, Any]] = []
    evaluation: list[dict[str, Any]] | None = None
    for unit in job.units:
        rows, eval_rows = record.build_rehearsal_rows(unit, config, tokenizer, world)
        train += rows
        evaluation = eval_rows
    cls = getattr(trl, record.trainer_class)
    extra: dict[str, Any] = {}
    if record.generation_groups:
        extra["reward_funcs"] = zero_reward
    if record.needs_teacher:
        extra["teacher_model"] = spec.teacher_model  # built from its config, like the student
    if spec.peft:
        # The job's LoraConfig, built by TRL's own get_peft_config: the trainer wraps the model itself
        # (get_peft_model; enable_input_require_grads under gradient checkpointing), as in the job.
        extra["peft_config"] = lora_config(spec.peft)
    trainer = cls(
        model=spec.model,
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(train),
        eval_dataset=Dataset.from_list(evaluation) if evaluation is not None else None,
        **extra,
    )
    observed = Observed()
    if record.generates:
        _fix_generation_length(trainer, job.unit)
        _record_forwards(trainer, observed)
    else:
        _record_batches(trainer, observed)
    return trainer, observed


def zero_reward(completions: list[Any], **_: Any) -> list[float]:
    """The rehearsal's reward: rewards are values, not shapes, so a constant compiles the same graphs."""
    return [0.0] * len(completions)


def _world_size() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def _batches(record: TrainerFamily, unit: RehearsalUnit, config: Any, world: int) -> tuple[int, int]:
    """(rows per batch, batches): one optimizer step of every process, or one eval pass."""
    per_device = (
        config.per_device_eval_batch_size if unit.kind == "eval" else config.per_device_train_batch_size
    )
    # DPO and Reward batches stack chosen and rejected rows: the unit's batch is twice the pairs
    rows = unit.batch // record.rows_per_example
    if unit.kind == "eval" or rows < per_device:
        return rows, world  # a short (last) batch happens once per epoch
    return rows, config.gradient_accumulation_steps * world


RowsPair = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def sft_step_rows(
    record: TrainerFamily, unit: RehearsalUnit, config: Any, tokenizer: Any, world: int
) -> RowsPair:
    rows, batches = _batches(record, unit, config, world)
    packing = bool(
        config.packing if unit.kind == "train" or config.eval_packing is None else config.eval_packing
    )
    if config.padding_free or (packing and config.packing_strategy in ("bfd", "bfd_split")):
        # One batch, concatenated into one row: the examples of the step are its whole dataset.
        if unit.batch != 1:
            raise RehearsalError(f"a padding-free SFT batch is one row, not {unit.batch}")
        if world > 1 or config.gradient_accumulation_steps > 1:
            raise RehearsalError(
                "padding-free SFT is rehearsed in one process without gradient accumulation: BFD packing "
                "reorders the rows across batches, so the data of several batches cannot be pinned"
            )
        data = padding_free_rows(
            tokenizer,
            unit.seq_len,
            config.per_device_train_batch_size if unit.kind == "train" else config.per_device_eval_batch_size,
            config.pad_to_multiple_of,
            config.max_length if packing else None,
        )
        return data, data if unit.kind == "eval" else None
    data = []
    for _ in range(batches):
        data += sft_rows(
            tokenizer, rows, unit.seq_len, config.pad_to_multiple_of, config.max_length, packing=packing
        )
    return data, data if unit.kind == "eval" else None


def reward_step_rows(
    record: TrainerFamily, unit: RehearsalUnit, config: Any, tokenizer: Any, world: int
) -> RowsPair:
    pairs, batches = _batches(record, unit, config, world)
    data = []
    for _ in range(batches):
        data += reward_rows(tokenizer, pairs, unit.seq_len, config.pad_to_multiple_of, config.max_length)
    return data, data if unit.kind == "eval" else None


def dpo_step_rows(
    record: TrainerFamily, unit: RehearsalUnit, config: Any, tokenizer: Any, world: int
) -> RowsPair:
    pairs, batches = _batches(record, unit, config, world)
    texts = TextMaker(tokenizer)
    data = []
    for _ in range(batches):
        data += preference_rows(
            texts, pairs, unit.seq_len, config.pad_to_multiple_of, config.max_length, tokenizer.eos_token
        )
    return data, data if unit.kind == "eval" else None


def prompt_step_rows(
    record: TrainerFamily, unit: RehearsalUnit, config: Any, tokenizer: Any, world: int
) -> RowsPair:
    """GRPO/RLOO: prompts for one generation round (TRL repeats each num_generations times), and
    for one eval batch on every process when the unit is an evaluation."""
    if unit.prompt_len is None or unit.completion_len is None:
        raise RehearsalError("a GRPO/RLOO unit needs its prompt and completion lengths")
    if getattr(config, "use_transformers_paged", False):
        raise RehearsalError("rehearsal of GRPO/RLOO with paged generation is not written yet")
    texts = TextMaker(tokenizer)
    multiple = config.pad_to_multiple_of
    if not record.generation_groups:
        # one completion per prompt; a round is B x gradient_accumulation_steps rows on every process
        prompts = config.per_device_train_batch_size * config.gradient_accumulation_steps * world
    else:
        prompts = config.generation_batch_size // config.num_generations
    train = prompt_rows(texts, prompts, unit.prompt_len, multiple)
    if unit.kind == "train":
        return train, None
    copies = (config.num_generations_eval or config.num_generations) if record.generation_groups else 1
    if unit.batch % copies:
        raise RehearsalError(
            f"an eval batch of {unit.batch} rows is not a whole number of {copies} generations"
        )
    return train, prompt_rows(texts, unit.batch // copies * world, unit.prompt_len, multiple)


def kto_step_rows(
    record: TrainerFamily, unit: RehearsalUnit, config: Any, tokenizer: Any, world: int
) -> RowsPair:
    rows, batches = _batches(record, unit, config, world)
    texts = TextMaker(tokenizer)
    kl_len = unit.kl_len if config.loss_type != "apo_zero_unpaired" else None
    data = []
    for _ in range(batches):
        data += kto_rows(
            texts,
            rows,
            unit.seq_len,
            kl_len,
            config.pad_to_multiple_of,
            config.max_length,
            tokenizer.eos_token,
        )
    return data, data if unit.kind == "eval" else None


def _fix_generation_length(trainer: Any, unit: RehearsalUnit) -> None:
    """Every row generates exactly `completion_len` tokens: the training width is then exact.

    With a static cache pinned by `max_cache_len` the cache shape does not depend on max_new_tokens;
    a unit that carries a planned cache length pins it.
    """
    generation = trainer.generation_config
    generation.max_new_tokens = unit.completion_len
    generation.min_new_tokens = unit.completion_len
    if unit.cache_len is not None:
        generation.max_cache_len = unit.cache_len


def _record_batches(trainer: Any, observed: Observed) -> None:
    """Record the shape of every batch as the loss is computed on it.

    Not in the collator: the dataloader fetches the next batch before the current step ends.
    """
    compute_loss = trainer.compute_loss

    def recording_compute_loss(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        observed.batches.append(tuple(inputs["input_ids"].shape))
        if "KL_input_ids" in inputs:
            observed.kl_batches.append(tuple(inputs["KL_input_ids"].shape))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording_compute_loss


def _record_forwards(trainer: Any, observed: Observed) -> None:
    """GRPO/RLOO: record every log-prob forward's input shape and every generation round's prompt width;
    distillation: every student / teacher backbone forward (`_get_last_hidden_state`) instead."""
    generate = compat_trl.trainer_method(trainer, compat_trl.GENERATE)
    if (hidden := compat_trl.trainer_method(trainer, compat_trl.HIDDEN_STATE)) is not None:

        def recording_hidden(model: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
            observed.forwards.append(tuple(input_ids.shape))
            return hidden(model, input_ids, *args, **kwargs)

        compat_trl.replace_trainer_method(trainer, compat_trl.HIDDEN_STATE, recording_hidden)
        logps = None
    else:
        logps = compat_trl.trainer_method(trainer, compat_trl.LOG_PROBS)

    def recording_logps(
        model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, **kwargs: Any
    ) -> Any:
        batch_size = kwargs.get("batch_size") or input_ids.size(0)
        for start in range(0, input_ids.size(0), batch_size):
            observed.forwards.append((min(batch_size, input_ids.size(0) - start), input_ids.size(1)))
        assert logps is not None
        return logps(model, input_ids, attention_mask, logits_to_keep, **kwargs)

    def recording_generate(prompt_ids: list[Any], *args: Any, **kwargs: Any) -> Any:
        from warmup.rehearsal.units import ceil_to

        longest = max(len(ids) for ids in prompt_ids)
        observed.prompt_widths.append(ceil_to(longest, trainer.pad_to_multiple_of))
        assert generate is not None
        return generate(prompt_ids, *args, **kwargs)

    if logps is not None:
        compat_trl.replace_trainer_method(trainer, compat_trl.LOG_PROBS, recording_logps)
    compat_trl.replace_trainer_method(trainer, compat_trl.GENERATE, recording_generate)


def evaluate_as_in_training(trainer: Any) -> None:
    """Run the evaluation the way it happens during training: inside train(), on the prepared model.

    Trainer evaluates `self.model` (the raw module) once train() has prepared the compiled wrapper,
    so a standalone evaluate() would compile a different graph than a training run's evaluation.
    The config has eval_on_start; a callback leaves train() right after that evaluation.
    """
    from transformers import TrainerCallback

    class StopAfterEvaluation(TrainerCallback):
        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            raise _EvaluationDone

    trainer.add_callback(StopAfterEvaluation())
    try:
        trainer.train()
    except _EvaluationDone:
        return
    raise RehearsalError("the evaluation never ran: train() finished without evaluating")


class ShapesNotProduced(RehearsalError):
    """The spec's trainer did not produce the unit's shapes: another attempt produces the same ones, so the
    worker does not retry it (a signature a run reported that the spec cannot make, say)."""


def check_shapes(trainer: str, unit: RehearsalUnit, account: StepAccount) -> None:
    """Fail the run unless TRL produced exactly the unit's shapes (never publish a wrong entry)."""
    want = (unit.batch, unit.seq_len)
    record = family(trainer)
    if record.generates:
        seen = set(account.forwards)
        if not seen:
            raise ShapesNotProduced("the GRPO/RLOO step ran no log-prob forward; nothing was rehearsed")
        if seen != {want}:
            raise ShapesNotProduced(
                f"the step produced forward shapes {sorted(seen)}, the unit needs only {want}"
            )
        if unit.prompt_len is not None and set(account.prompts) != {unit.prompt_len}:
            raise ShapesNotProduced(
                f"generation used prompt widths {sorted(set(account.prompts))}, "
                f"the unit needs {unit.prompt_len}"
            )
        return
    seen = set(account.batches)
    if not seen:
        raise ShapesNotProduced("the trainer collated no batch; nothing was rehearsed")
    if seen != {want}:
        raise ShapesNotProduced(
            f"the trainer produced batch shapes {sorted(seen)}, the unit needs only {want}"
        )
    if record.kl_rows and unit.kl_len is not None:
        kl_seen, kl_want = set(account.kl_batches), (unit.batch, unit.kl_len)
        if kl_seen != {kl_want}:
            raise ShapesNotProduced(
                f"the KTO step built KL rows {sorted(kl_seen)}, the unit needs only {kl_want}"
            )
