"""Trace skip: a warmed training process runs Dynamo's output for a warmed call without tracing it.

A warmed Inductor cache spares the backend compile, but every new process still traces each graph with
Dynamo and runs AOTAutograd again before it finds the cached kernels. torch 2.13's `aot_compile` keeps
what those two steps produce (the guards, the transformed bytecode and the AOTAutograd-wrapped
Inductor graph, forward and backward) in one file, and `torch.compiler.load_compiled_function` loads it
without tracing (docs/compile-caches.md, "Skipping the trace", says why this mechanism and not
`caching_precompile` or the Mega-Cache).

`aot_compile` needs one graph without breaks, and TRL's forwards break: its fused LM head is an
`autograd.Function` Dynamo cannot trace. The backbone (`model.base_model`, the decoder stack: nearly
all of the compute and of the trace) has no break. So when accelerate wraps a model in `torch.compile` (or
DeepSpeed's engine compiles it in place, `nn.Module.compile`: one split for both), the backbone is compiled
on its own (one graph, with the job's backend, mode and shape policy) and, in a warmed process, runs its
loaded artifact; the rest of the forward (the LM head, already outside any graph
in TRL's fused path, and the loss) runs eagerly around it, so that a warmed process traces nothing. The
rehearsal and the training process split the same way (the rehearsal leaves `trace/split.json` to say
so), so the graphs and their cache keys are the same in both. A PEFT model splits at the backbone of the model it
adapts (`adapted_model`), which is given its input embeddings (the embedding's gradient-checkpointing hook runs
eagerly before it).

The rehearsal (`Recorder`) notes the first backbone call per input signature and, after training,
compiles each ahead of time, saves it under `trace/` in the run's cache directory (ordinary files:
the entry, the store, pull and relocation carry them as any other), and keeps it only if, loaded back,
its outputs and gradients on the rehearsal batch equal a fresh compile's (bit for bit on CPU, where both
run their kernels on one thread for the check, so that every sum is taken in one order; `compare`). In a DDP
job of several processes (the split reaches through DDP to the model it replicates) every rank records; rank 0
makes the artifacts, and every other rank checks each on its own call before any is kept; so in a ZeRO-1/2 job,
whose parameters stay whole. A parameter-sharded job (FSDP, ZeRO-3) keeps none (`losses.predicted_loss`).

A training process (`enable`, from `warmup.activate` or the sitecustomize of `warmup exec`) loads the
artifacts made for the backbone's class and config when accelerate compiles the model; each call runs
the first artifact whose guards (torch's own: shapes, strides, dtypes, `requires_grad`, grad mode,
train/eval, the config values the graph read) accept it, else the backbone compiled by Dynamo (a
miss: traced, served by the Inductor cache). A process that does not load them (the switch, a torch without
the mechanism, an artifact refused) still splits the backbone as the rehearsal did: its graphs are the warmed
ones, and the Inductor caches serve them. The guards that cannot be serialised (object identities,
closures of the decorators around `forward`) are left out, so each artifact also carries a digest of
the model's config and is refused for a model whose config differs.

The modules, each importing only those before it:
- `artifacts`: what an artifact is for (the model's class, config and adapters; the call; the guards kept; the
  functions it refers to), its name and how it loads.
- `split`: the backbone compiled on its own, in the rehearsal and the training process alike, and the switch.
- `losses`: why a job keeps no trace, or only some, in words a user can act on.
- `capture`: the rehearsal's recorder, the ahead-of-time compile, the save and the numeric check.
- `serve`: the training process's artifacts, loaded and served (`enable`, `active`).

Where a training process's compile time went (the trace skip's share of it included) is the coverage report's:
`warmup/pod/callback/timings.py`.
"""
