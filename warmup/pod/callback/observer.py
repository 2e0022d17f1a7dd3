"""`WarmupCallback`: what a real training run met, what it still compiled, reported to the service.

    from warmup import WarmupCallback
    trainer = SFTTrainer(..., callbacks=[WarmupCallback("job.yaml", server="http://warmup:8000")])

Under `warmup exec`, `WarmupCallback()` needs no arguments: the spec, the server (WARMUP_SERVER) and
the cache directory come from the environment exec sets.

How it observes the run:
- Signatures met: forward pre-hooks record the shape of each model call's `input_ids` (or
  `inputs_embeds`, or first tensor argument) and its phase: `train` with grad on, `eval` in eval
  mode, `old_logps` in train mode without grad, `generate_*` when a KV cache is passed, `ref` for the
  reference model. Hooks on the model, not on the data, see what the compiled graph sees (DPO's
  concatenated chosen+rejected rows, padded or packed batches) for every TRL trainer. They sit on the
  modules the trainer calls: its `model_wrapped` (torch.compile's wrapper, DDP), whose hooks run
  outside the compiled frame, found from the trainer calling `on_train_begin`; the bare model (eager
  evaluation, generation); and the trainer's `ref_model`. A hook reached inside a compiled frame
  returns at once (`torch.compiler.is_compiling()`): it never changes a graph. Without a reference
  model to hook, reference signatures are inferred from the policy's shapes, on which TRL runs it.
- Fresh compiles: the backend's counter (Inductor: FX graph and AOTAutograd cache misses and
  bypasses, and new files in the cache dir; Neuron: the runtime's cache statistics and new NEFFs).
  When a new shape is met, the compiles since the previous new shape are its own; a shape that
  compiled and that the plan did not list gets one warning.
- Report: `POST /v1/coverage` at the end of training, and when the process ends without training
  ending (train() raised): an atexit hook, since callbacks do not see exceptions. `report()` can
  also be called by hand. The service turns missed signatures into new tasks. Posting never
  raises: a server that is down is logged and training goes on. The report is also written to
  `<output_dir>/warmup-coverage.json`. Under torchrun, the first rank of each node (local rank 0: each
  node installs its own copy) always reports, other ranks only when they compiled something.
- Step time: the wall time of each optimizer step that met no new shape (so compiled nothing) is summed
  into the report (`details.timed_steps`); the service calibrates the job's padding advice with it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from warmup.diagnosis import Diagnosis, RunFacts, args_differences, diagnose
from warmup.errors import WarmupError
from warmup.pod.callback.ledger import CompileLedger
from warmup.pod.callback.report import (
    MAX_LISTED_FILES,
    Shape,
    label,
    post_report,
    report_toolchain,
    write_report,
)
from warmup.pod.callback.strict import nothing_pulled, recompiled, strict_by_default, would_compile
from warmup.pod.callback.timings import compile_timings  # Dynamo's timers: any torch.compile backend

if TYPE_CHECKING:
    from warmup.pod.activation import ToolchainCheck

log = logging.getLogger("warmup.pod.callback")


class WarmupCallback(TrainerCallback):
    """Records the signatures a run meets and its fresh compiles, and posts a coverage report."""

    def __init__(
        self,
        spec: Any = None,
        *,
        server: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        strict: bool | None = None,
    ) -> None:
        from warmup.job.spec import Spec, load_spec

        raw = os.environ.get("WARMUP_SPEC") if spec is None else spec
        if raw is None:
            raise ValueError(
                "WarmupCallback needs the job's spec (a path, a mapping or a Spec), or WARMUP_SPEC"
            )
        if isinstance(raw, str) and raw.lstrip().startswith("{"):
            raw = json.loads(raw)
        self.spec = raw if isinstance(raw, Spec) else load_spec(raw)
        self.server = server or os.environ.get("WARMUP_SERVER")
        self.token = token
        self.timeout_s = timeout_s
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._ledger = CompileLedger()  # the shapes met and the compiles put on them
        self._warned: set[Shape] = set()
        self._step = 0
        # Steady-state step time (steps that met no new shape, so compiled nothing): the service
        # calibrates `warmup advise`'s step cost from it.
        self._step_started: float | None = None
        self._shapes_at_step_start = 0
        self._timed_steps = 0
        self._timed_seconds = 0.0
        # the first step's wall time: where compiles (or loads) happen
        self._first_step_s: float | None = None
        self._hooks: list[Any] = []
        self._watching_ref = False
        self._output_dir: Path | None = None
        self._training = False
        self._reported = False
        self.stand_in = False  # given by `warmup exec --strict` (its sitecustomize), not by the script
        self.last_report: dict[str, Any] | None = None
        self.last_response: dict[str, Any] | None = None
        # Strict: stop at once, rather than compile, when training meets a graph the cache does not hold.
        self.strict = strict_by_default() if strict is None else strict
        self._verified = False
        self._toolchain_check: ToolchainCheck | None = None
        self._warmed: set[str] | None = None  # signature keys the pulled cache holds (None: no pull seen)
        self._facts = RunFacts()
        self._why: dict[Shape, Diagnosis] = {}
        self._refused: Shape | None = None
        self._planned, self._templates = self._plan()

    # --- the plan ---------------------------------------------------------------------------------

    def _plan(self) -> tuple[dict[Shape, Any], dict[str, Any]]:
        """Planned signatures by shape, and per phase one planned signature to build others from."""
        from warmup.planner.planning import plan_spec

        try:
            signatures = plan_spec(self.spec).signatures
        except Exception as error:  # a coverage report is not worth failing training for
            log.warning("trl-warmup: cannot plan the spec (%s); the report will list no signatures", error)
            return {}, {}
        planned: dict[Shape, Any] = {}
        templates: dict[str, Any] = {}
        for signature in signatures:
            planned.setdefault((signature.phase, signature.batch, signature.seq_len), signature)
            templates.setdefault(signature.phase, signature)
        return planned, templates

    @property
    def cache_dir(self) -> Path:
        from warmup.backends.registry import get_backend

        if self._cache_dir is None:
            target = self.spec.target
            self._cache_dir = get_backend(target.backend, target.device).default_cache_dir()
        return self._cache_dir

    # --- TrainerCallback events -------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._output_dir = Path(args.output_dir) if getattr(args, "output_dir", None) else None
        self._verify_toolchain()  # before counting: it may build Inductor's ISA probes in the cache dir
        self._start_counting()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.stand_in and self._script_has_its_own():
            # `warmup exec --strict` gave this trainer a callback, and the script added its own after the
            # trainer was built (add_callback): the script's watches the run, this one stays out of it.
            self._reported = True  # nothing observed, nothing reported
            return
        self._output_dir = Path(args.output_dir) if getattr(args, "output_dir", None) else None
        self._verify_toolchain()
        self._start_counting()
        self._training, self._reported = True, False
        self._facts = _run_facts(model, args, self.spec.args)
        if not self._hooks:
            self._watch_models(model)
        atexit.register(self._report_at_exit)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_started = time.perf_counter()
        self._shapes_at_step_start = len(self._ledger.met)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step = int(getattr(state, "global_step", self._step + 1))
        if self._step_started is not None and self._first_step_s is None:
            self._first_step_s = time.perf_counter() - self._step_started
        if self._step_started is not None and len(self._ledger.met) == self._shapes_at_step_start:
            self._timed_steps += 1
            self._timed_seconds += time.perf_counter() - self._step_started
        self._step_started = None
        self._settle(every_step=True)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._settle()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.report("completed")

    # --- observing --------------------------------------------------------------------------------

    def _verify_toolchain(self) -> None:
        """Compute this process's toolchain exactly and refuse a cache pulled for another one (the pod may
        have remembered or predicted its facts: warmup.pod.activation.verify_pulled_toolchain)."""
        if self._verified:
            return
        self._verified = True
        from warmup.client.background import wait_for_pull
        from warmup.client.local import read_local_manifest
        from warmup.pod.activation import read_manifest, verify_pulled_toolchain

        try:
            wait_for_pull()  # under `warmup exec`, the cache may still be downloading beside this process
        except WarmupError as failed:
            self.report("refused", failed)
            raise

        manifest = read_local_manifest(self.cache_dir, self.spec.key())
        self._warmed = set(manifest.signatures) if manifest is not None else None
        if manifest is None:
            try:  # a directory `warmup warm` filled (its toolchain is checked by `warmup.activate`)
                warmed = read_manifest(self.cache_dir)
            except WarmupError:
                warmed = None
            if warmed is not None and warmed.get("spec_key") == self.spec.key():
                self._warmed = set(warmed.get("entries") or {})
        if manifest is None and self._warmed is None:
            if self.strict:
                error = nothing_pulled(self.cache_dir)
                self.report("refused", error)
                raise error
            return
        if manifest is None:
            return
        try:
            self._toolchain_check = verify_pulled_toolchain(self.cache_dir, self.spec)
        except WarmupError as error:  # this process cannot compute its toolchain: say so, go on
            log.warning("trl-warmup: cannot check the toolchain of %s (%s)", self.cache_dir, error)
            return
        if self._toolchain_check is not None and self._toolchain_check.differences:
            mismatch = self._toolchain_check.error()
            self.report("refused", mismatch)
            raise mismatch

    def _signature_for(self, shape: Shape) -> Any:
        """The planned signature of `shape`, else one built from the phase's planned one, else None."""
        signature = self._planned.get(shape)
        if signature is None and shape[0] in self._templates:
            signature = self._templates[shape[0]].model_copy(update={"batch": shape[1], "seq_len": shape[2]})
        return signature

    def _is_warm(self, signature: Any) -> bool:
        return signature.compile == "eager" or (self._warmed is not None and signature.key() in self._warmed)

    def _diagnose(self, shape: Shape) -> Diagnosis:
        """Why `shape` compiles or would: the nearest warmed signature and the fields that differ."""
        warmed = [s for s in self._planned.values() if self._warmed is not None and s.key() in self._warmed]
        check = self._toolchain_check
        diagnosis = diagnose(
            shape,
            self._signature_for(shape),
            warmed,
            self._facts,
            planned=shape in self._planned,
            toolchain_differences=check.differences if check is not None else None,
        )
        self._why[shape] = diagnosis
        return diagnosis

    def _refuse_unwarmed(self, shape: Shape) -> None:
        """Strict: raise before `shape` (or the reference pass TRL runs on it) compiles, unless warm."""
        shapes = [shape]
        if shape[0] == "train" and "ref" in self._templates and not self._watching_ref:
            shapes.append(("ref", shape[1], shape[2]))
        for candidate in shapes:
            signature = self._signature_for(candidate)
            if signature is not None and self._is_warm(signature):
                continue
            self._refuse(candidate, "was not warmed")

    def _refuse(self, shape: Shape, what: str) -> None:
        diagnosis = self._diagnose(shape)
        self._refused = shape
        error = would_compile(shape, what, diagnosis)
        self.report("refused", error)
        raise error

    def _start_counting(self) -> None:
        self._ledger.start_counting(self.spec.target.backend, self.spec.target.device, self.cache_dir)

    def _watch_models(self, model: Any) -> None:
        """Hook the modules the trainer calls. The callback event hands over the bare model, whose hooks
        run inside the compiled frame; the trainer's `model_wrapped` (torch.compile's wrapper, DDP)
        runs its hooks outside, so it is found on the stack of the trainer that called this event."""
        trainer = self._calling_trainer()
        modules = [getattr(trainer, "model_wrapped", None), model]
        for module in {id(m): m for m in modules if m is not None}.values():
            self._hooks.append(module.register_forward_pre_hook(self._observer(None), with_kwargs=True))
        ref = getattr(trainer, "ref_model", None)
        if ref is not None and hasattr(ref, "register_forward_pre_hook"):
            self._hooks.append(ref.register_forward_pre_hook(self._observer("ref"), with_kwargs=True))
            self._watching_ref = True

    def _script_has_its_own(self) -> bool:
        trainer = self._calling_trainer()
        handler = getattr(trainer, "callback_handler", None)
        return any(
            isinstance(c, WarmupCallback) and not c.stand_in for c in getattr(handler, "callbacks", ())
        )

    def _calling_trainer(self) -> Any:
        """The Trainer whose callback handler is running this callback, or None."""
        from warmup._compat.transformers import trainer_running

        return trainer_running(self)

    def _observer(self, phase: str | None) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._on_forward(module, args, kwargs, phase)

        return hook

    def _on_forward(
        self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], phase: str | None
    ) -> None:
        import torch

        if torch.compiler.is_compiling():  # inside a compiled frame: observing would change the graph
            return None
        try:
            shape = _shape_of(module, args, kwargs, torch.is_grad_enabled(), phase)
        except Exception as error:  # never let observing break a training step
            log.debug("trl-warmup: forward hook failed: %s", error)
            return None
        if shape is None or shape in self._ledger.met:
            return None
        self._settle()  # what compiled until now belongs to the shapes met before this one
        if not self._ledger.meet(shape, self._step):
            return None
        if self.strict and self._reported is False:
            self._refuse_unwarmed(shape)  # raises: the forward does not run, nothing compiles
        return None

    def _settle(self, *, every_step: bool = False) -> None:
        """Attribute the compiles since the last check to the shapes first met since then. Strict, at
        every step: a compile the cache should have spared (a warmed shape, or a recompile of a shape
        already met) stops training."""
        if not (self._ledger.has_pending() or (every_step and self.strict)):
            return
        settled = self._ledger.settle()
        if settled is None or not settled.compiled:
            return
        for shape in settled.shapes:
            self._warn_once(shape)
        if self.strict and not self._reported:
            if settled.shapes:
                self._refuse(settled.shapes[0], "compiled although the cache holds it")
            again = recompiled(self._step)
            self.report("refused", again)
            raise again

    def _warn_once(self, shape: Shape) -> None:
        if shape in self._warned:
            return
        self._warned.add(shape)
        named = label(shape)
        diagnosis = self._diagnose(shape)
        if shape not in self._planned:
            then = (
                "it is reported to the service, which warms it for the next run if the spec can produce it"
                if self.server
                else "give the callback a server (or set WARMUP_SERVER) to report it"
            )
            log.warning(
                "trl-warmup: %s compiled during training and the plan of this spec did not list it: %s; %s",
                named,
                diagnosis.sentence(),
                then,
            )
        elif not diagnosis.warmed:
            log.warning(
                "trl-warmup: %s was planned but compiled during training: the cache in %s does not hold it "
                "(pulled with --allow-partial, or not pulled); %s",
                named,
                self.cache_dir,
                diagnosis.sentence(),
            )
        else:
            log.warning(
                "trl-warmup: %s compiled during training although the cache in %s holds it: %s",
                named,
                self.cache_dir,
                diagnosis.sentence(),
            )

    # --- the report -------------------------------------------------------------------------------

    def build_report(self, status: str, error: str | None = None) -> dict[str, Any]:
        """The POST /v1/coverage body for what was observed so far."""
        self._settle()
        fresh = self._ledger.fresh()
        met: dict[str, None] = {}
        missed: dict[str, dict[str, Any]] = {}
        unmatched: list[str] = []
        observed = dict(self._ledger.met)
        for shape, seen in list(observed.items()):  # the reference model runs on the policy's batches
            if shape[0] == "train" and "ref" in self._templates and not self._watching_ref:
                observed.setdefault(("ref", shape[1], shape[2]), seen)
        for shape, seen in sorted(observed.items()):
            signature = self._signature_for(shape)
            if signature is None:
                unmatched.append(label(shape))
                continue
            key = signature.key()
            met[key] = None
            # A refused shape did not compile, but training needs it: the service warms it for next time.
            if (seen.compiled or shape == self._refused) and signature.compile != "eager":
                missed[key] = signature.model_dump(mode="json")
        details: dict[str, Any] = {
            "status": status,
            "steps": self._step,
            "rank": int(os.environ.get("RANK", "0")),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "host": socket.gethostname(),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "shapes": {
                label(shape): {"step": seen.step, "compiled": seen.compiled}
                for shape, seen in sorted(self._ledger.met.items())
            },
            "unplanned": sorted(label(s) for s in self._ledger.met if s not in self._planned),
            "unmatched": unmatched,
            "cache_dir": str(self.cache_dir),
        }
        if fresh is not None:
            details["fresh"] = {name: count for name, count in fresh.counts.items() if count}
            details["new_files"] = len(fresh.new_files)
            details["new_files_first"] = list(fresh.new_files[:MAX_LISTED_FILES])
        details["timings"] = compile_timings(self._first_step_s)
        if self._timed_steps:
            details["timed_steps"] = {"count": self._timed_steps, "seconds": round(self._timed_seconds, 6)}
        if self._why:
            details["why"] = {
                label(shape): diagnosis.as_json() for shape, diagnosis in sorted(self._why.items())
            }
        check = self._toolchain_check
        if check is not None and check.differences:
            details["toolchain_mismatch"] = {
                name: {"here": here, "pulled": pulled}
                for name, (here, pulled) in sorted(check.differences.items())
            }
        if self._facts.args:  # the run is not the spec's: the service says so beside what it met
            details["args"] = {
                name: {"spec": theirs, "run": ours} for name, (theirs, ours) in self._facts.args.items()
            }
        if self.strict:
            details["strict"] = True
        if self._refused is not None:
            details["refused"] = label(self._refused)
        if error:
            details["error"] = error[:2000]
        return {
            "spec": self.spec.model_dump(mode="json"),
            "toolchain": report_toolchain(self.cache_dir, self.spec),
            "met": list(met),
            "missed": list(missed.values()),
            "fresh_compiles": fresh.total if fresh is not None else 0,
            "details": details,
        }

    def report(
        self, status: str = "completed", error: BaseException | str | None = None
    ) -> dict[str, Any] | None:
        """Post the coverage report (once per training run); never raises. Returns the service's
        answer, or None when it was not posted."""
        if self._reported:
            return self.last_response
        self._reported, self._training = True, False
        atexit.unregister(self._report_at_exit)
        text = (
            None
            if error is None
            else (error if isinstance(error, str) else f"{type(error).__name__}: {error}")
        )
        try:
            body = self.build_report(status, text)
        except Exception as failure:
            log.warning("trl-warmup: could not build the coverage report: %s", failure)
            return None
        self.last_report = body
        written = write_report(self._output_dir, body)
        speaks = body["details"]["rank"] == 0 or body["details"]["local_rank"] == 0
        if not speaks and not body["missed"] and not body["fresh_compiles"]:
            return (
                None  # the first rank of each node speaks for its copy; others only when they saw something
            )
        self.last_response = post_report(
            body, status, written, server=self.server, token=self.token, timeout_s=self.timeout_s
        )
        return self.last_response

    def _report_at_exit(self) -> None:
        if not self._training or self._reported:
            return
        error = getattr(sys, "last_value", None)
        self.report("failed", error or "the process ended before training did")


def _shape_of(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, phase: str | None
) -> Shape | None:
    tensor = kwargs.get("input_ids")
    if tensor is None:
        tensor = kwargs.get("inputs_embeds")
    if tensor is None and args:
        tensor = args[0]
    dims = getattr(tensor, "shape", None)
    if dims is None or len(dims) < 2:
        return None
    batch, seq_len = int(dims[0]), int(dims[1])
    if phase is None:
        # transformers 5.24 passes the KV cache as `cache` (older versions: `past_key_values`)
        if kwargs.get("cache", kwargs.get("past_key_values")) is not None:
            phase = "generate_prefill" if seq_len > 1 else "generate_decode"
        elif not _innermost(module).training:
            phase = "eval"
        else:
            phase = "train" if grad else "old_logps"
    return phase, batch, seq_len


def _innermost(module: Any) -> Any:
    """The model under torch.compile's and DDP's wrappers: its train/eval mode is the one that counts."""
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None)
        if inner is None:
            inner = getattr(module, "module", None)
        if inner is None:
            return module
        module = inner
    return module


def _run_facts(model: Any, args: Any, spec_args: dict[str, Any]) -> RunFacts:
    """The graph-relevant settings of the model training runs, as the signature names them, and the run's
    arguments that shape its batches where they differ from the spec's."""
    try:
        parameters = list(model.parameters()) if model is not None else []
    except Exception:  # not a torch module: nothing observed
        parameters = []
    dtype = str(parameters[0].dtype).removeprefix("torch.") if parameters else None
    trainable = sum(1 for p in parameters if p.requires_grad)
    autocast = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else None
    return RunFacts(
        dtype=dtype,
        autocast=autocast,
        gradient_checkpointing=_optional_bool(getattr(model, "is_gradient_checkpointing", None)),
        frozen=(trainable < len(parameters)) if parameters else None,
        args=args_differences(spec_args, args) if args is not None else {},
    )


def _optional_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


__all__ = ["WarmupCallback"]
