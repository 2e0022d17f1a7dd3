"""The split: the backbone of a compiled model compiled on its own, one graph without breaks, the rest of the
forward run eagerly around it; the same in the rehearsal and the training process, so their graphs are the same."""

from __future__ import annotations

import contextlib
import logging
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warmup._compat import kernels as compat_kernels
from warmup._compat import torch as compat_torch
from warmup.errors import IncompatibleLibraryError
from warmup.trace_skip.artifacts import config_digest

log = logging.getLogger(__name__)

# WARMUP_TRACE_SKIP=0 turns it off in a training process (and its capture in a rehearsal).
ENV_VAR = "WARMUP_TRACE_SKIP"
# An adapter's settings that name where its model came from, not what it computes.
COSMETIC_ADAPTER_KEYS = frozenset({"base_model_name_or_path", "revision"})


def unavailable_reason() -> str | None:
    """Why this process cannot skip the trace (None: it can): the switch, or torch lacking what the trace skip
    reaches (the mechanism, `aot_compile` and `load_compiled_function`, among it)."""
    if os.environ.get(ENV_VAR, "1") == "0":
        return f"{ENV_VAR}=0"
    return compat_torch.trace_skip_problem()


def is_plain(module: Any) -> bool:
    """Whether calling the module is calling its `forward` (no hooks, no custom `__call__`): the artifact
    holds `forward` only, so a module with hooks goes through Dynamo, which traces the hooks too."""
    import torch

    return not compat_torch.has_hooks(module) and type(module).__call__ is torch.nn.Module.__call__


def adapted_model(model: Any) -> tuple[Any, dict[str, Any]]:
    """The transformers model a PEFT wrapper adapts (peft's `get_base_model`), with its adapters' settings by
    name; the model itself and none when it is not a PEFT model. The adapters' layers sit inside the backbone,
    so a LoRA model splits where the model it adapts does."""
    if type(model).__module__.partition(".")[0] != "peft" or not callable(
        getattr(model, "get_base_model", None)
    ):
        return model, {}
    adapters = {
        name: {k: v for k, v in config.to_dict().items() if k not in COSMETIC_ADAPTER_KEYS}
        for name, config in getattr(model, "peft_config", {}).items()
    }
    return model.get_base_model(), adapters


def replicated_module(model: Any) -> Any:
    """The model DDP replicates on every rank (its `module`), the model itself when it is not wrapped in DDP.
    accelerate compiles the DDP wrapper; its forward runs eagerly around the split, and its gradient hooks sit on
    the parameters, outside any graph, so the backbone is the same graph on every rank (Dynamo's DDPOptimizer
    splits it at DDP's buckets when it traces it inside DDP's forward, in the warm-up and the training alike)."""
    import torch

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


def backbone_of(model: Any) -> Any:
    """The module whose forward is traced ahead of time: the model's backbone (`base_model`, the decoder
    stack), None when the model has none or it is not a plain module."""
    import torch

    backbone = getattr(model, "base_model", None)
    if not isinstance(backbone, torch.nn.Module) or backbone is model or not is_plain(backbone):
        return None
    # transformers' innermost model is its own base model; a PEFT wrapper's is not (its forward is the whole
    # model's again, LM head included): not split, it runs as before
    if getattr(backbone, "base_model", None) is not backbone:
        return None
    if not isinstance(getattr(type(backbone), "forward", None), types.FunctionType):
        return None
    return backbone


@dataclass
class Split:
    """A backbone whose forward Dynamo does not enter: it runs `serve` (artifacts) or else `compiled`."""

    module: Any
    backend: Any
    dynamic: bool | None
    compiled: Callable[..., Any]
    digest: str = ""  # config_digest(module), taken when the model is compiled
    # the torch settings Dynamo traces the backbone under, here and in `compiled` alike (`traced_under`)
    tracing: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


Serve = Callable[[Split, tuple[Any, ...], dict[str, Any]], Any]


def split_backbone(compiled: Any, serve: Serve) -> Split | None:
    """Make the backbone of the model accelerate just compiled a call Dynamo does not trace into: `serve`
    runs it (from an artifact, or recording the call), falling back to the backbone compiled on its own by
    Dynamo with the model's backend, mode and shape policy. `compiled`: an OptimizedModule (torch.compile of
    the model, or of DDP around it) or a module compiled in place (`nn.Module.compile`: DeepSpeed's engine
    compiles the model so under ZeRO-1/2); one split for both."""
    import torch

    model, backend, dynamic = compat_torch.compiled_module_parts(compiled)
    adapted, adapters = adapted_model(replicated_module(model))
    backbone = backbone_of(adapted)
    if backbone is None:
        return None
    _saveable_hub_kernels(backbone)
    tracing = traced_under(backbone)
    eager = backbone.forward
    compiled_backbone = compat_torch.dynamo_compiled(eager, backend=backend, dynamic=dynamic)
    if tracing is not contextlib.nullcontext:
        compiled_backbone = _traced_under(tracing, compiled_backbone)
    split = Split(backbone, backend, dynamic, compiled_backbone, config_digest(backbone, adapters), tracing)
    # The compiled model's call runs its forward eagerly around the backbone: what is left (TRL's LM head,
    # whose autograd.Function Dynamo cannot trace, and the loss) is a few small ops, and tracing them is
    # what a warmed process would otherwise still pay for on every shape. Calls of the bare model (TRL's
    # generation, under an OptimizedModule) run the backbone eagerly, as they did; a module compiled in place
    # has no bare model: every call of it is the compiled model's.
    inside = [0]

    def around(model_call: Callable[..., Any]) -> Callable[..., Any]:
        def compiled_model(*args: Any, **kwargs: Any) -> Any:
            inside[0] += 1
            try:
                return model_call(*args, **kwargs)
            finally:
                inside[0] -= 1

        return compiled_model

    # A PEFT model's backbone gets its input embeddings, not its token ids: under gradient checkpointing its
    # embedding's hook (transformers' enable_input_require_grads) calls `requires_grad_()` on the frozen
    # embedding's output, which torch cannot keep inside one graph; run eagerly before the backbone, it is an
    # input of the graph instead. Rehearsal and training embed alike, so their graphs are the same.
    embed_first = bool(adapters)

    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not inside[0]:
            return eager(*args, **kwargs)
        if (
            embed_first
            and not args
            and kwargs.get("input_ids") is not None
            and kwargs.get("inputs_embeds") is None
        ):
            kwargs = {
                **kwargs,
                "input_ids": None,
                "inputs_embeds": backbone.get_input_embeddings()(kwargs["input_ids"]),
            }
        return serve(split, args, kwargs)

    compat_torch.run_compiled_call(compiled, around)
    backbone.forward = forward
    return split


def _saveable_hub_kernels(backbone: Any) -> None:
    """Let torch save a backbone that calls transformers' hub-kernel functions (warmup/_compat/kernels.py): a
    name change only, made in the warm-up and the training process alike. Where this kernels moved what it
    needs, the trace is not kept (the warm-up says so) and the graphs are the same all the same."""
    try:
        compat_kernels.saveable_kernel_functions(backbone)
    except IncompatibleLibraryError as error:
        log.warning("trace skip: %s; a model using hub kernels keeps no trace", error)


def traced_under(backbone: Any) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """The torch settings Dynamo traces `backbone` under, in the warm-up and the training process alike, artifact
    or not. A backbone whose layers call transformers' hub-kernel functions sets kernels' context variable in each
    attention layer and resets it (warmup/_compat/kernels.py): under gradient checkpointing that is a change of
    state inside the checkpoint, which breaks the graph there unless Dynamo is told to make it once, in the
    forward (`checkpoint_side_effects_once`); the variable only routes a call, resolved as Dynamo traces, so
    the backward's recompute needs it no more than it needs it reset. Every other model: torch's defaults."""
    try:
        if not compat_kernels.sets_context_in_layers(backbone):
            return contextlib.nullcontext
    except IncompatibleLibraryError as error:
        log.warning("trace skip: %s; a checkpointed model using hub kernels keeps no trace", error)
        return contextlib.nullcontext
    problem = compat_torch.checkpoint_side_effects_problem()  # the same torch in both processes
    if problem is not None:
        log.warning("trace skip: %s; a checkpointed model using hub kernels keeps no trace", problem)
        return contextlib.nullcontext
    return compat_torch.checkpoint_side_effects_once


def _traced_under(
    tracing: Callable[[], contextlib.AbstractContextManager[Any]], compiled: Callable[..., Any]
) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with tracing():
            return compiled(*args, **kwargs)

    return call


def on_compiled_module(hook: Callable[[Any], None]) -> None:
    """Run `hook` on every model torch.compile compiles from now on, once torch has set it up: an
    OptimizedModule (accelerate's torch.compile, DDP's wrapper among them) or a module compiled in place
    (`nn.Module.compile`, which DeepSpeed's engine calls)."""
    compat_torch.on_compiled_module(hook)
    compat_torch.on_module_compiled_in_place(hook)


def on_module_compiled_in_place(hook: Callable[[Any], None]) -> None:
    """Run `hook` on every module compiled in place from now on (`nn.Module.compile`) only: no Dynamo imported."""
    compat_torch.on_module_compiled_in_place(hook)


def remove_hook(hook: Callable[[Any], None]) -> None:
    """Stop running `hook` on new compiled modules (a recorder or a trace skip done with)."""
    compat_torch.remove_compiled_module_hook(hook)
