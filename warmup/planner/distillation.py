"""DistillationTrainer: student generation, student train, teacher forward. docs/trl-shapes.md sections 6-7.

TRL 1.16's DistillationTrainer is always on-policy (no lmbda / off-policy path): each round the student
generates for the local generation batch of per_device_train_batch_size x gradient_accumulation_steps
prompts, prompts and completions are padded over that batch, and each micro-batch of
per_device_train_batch_size rows runs the student backbone (with grad) and the teacher backbone (without)
on (B, P + C). Both backbones are called without their LM heads (`_get_last_hidden_state`); the heads are
applied inside the chunked divergence loss. Evaluation generates per eval batch and runs both backbones on it.

Under torch.compile on Inductor nothing compiles: `_forward_redirection` calls the student and the teacher
through `accelerator.unwrap_model(...)`, which keeps the torch.compile wrapper (keep_torch_compile=True), and then
patches that wrapper's own `forward`, so both backbones run eagerly (checked in the truth tests). On Neuron every
pass compiles all the same.
"""

from __future__ import annotations

from warmup.errors import SpecError
from warmup.planner.common import PlanBuilder
from warmup.planner.online import eval_batches, plan_generation, rollout_lengths


def plan_distillation(plan: PlanBuilder) -> None:
    args = plan.args
    if plan.teacher is None:
        raise SpecError("the distillation trainer needs teacher_model", loc="teacher_model")
    if args.max_tool_calling_iterations is not None:
        plan.warn(
            "max_tool_calling_iterations is set: with tools, tool turns re-generate for data-dependent rows "
            "with data-dependent prompt lengths, which cannot be listed"
        )
    rollouts = rollout_lengths(plan)
    if rollouts is None:
        return
    train_rows = args.per_device_train_batch_size
    eval_rows = eval_batches(plan, copies_per_prompt=1)
    plan_generation(plan, [train_rows * args.gradient_accumulation_steps, *eval_rows], rollouts)

    # beta and temperature shape the divergence loss, which TRL runs as the student's forward (_forward_redirection).
    student = {"beta": args.beta, "temperature": args.temperature}
    widths = rollouts.sequences
    plan.add_many("train", [train_rows], widths, settings=student, runs_on="bare")
    plan.add_many("eval", eval_rows, widths, settings=student, runs_on="bare")
    plan.add_many("teacher", [train_rows, *eval_rows], widths, model=plan.teacher, runs_on="bare")
