"""A spec's `peft` block -> the `LoraConfig` the job's TRL script builds from it.

TRL's scripts (`trl sft`, `trl dpo`, ...) read the LoRA settings into `trl.ModelConfig` (`use_peft`,
`lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`, `lora_target_parameters`,
`lora_modules_to_save`, `lora_task_type`, `use_rslora`, `use_dora`) and hand the trainer
`get_peft_config(model_args)`. The rehearsal and the proof jobs build the config through those same two
TRL functions, so the adapter (rank, target modules, modules to save, task type) is the job's; the
trainer then wraps the model itself (`get_peft_model`, and `enable_input_require_grads` under gradient
checkpointing), as it does in the job.

TRL is imported only when a config is built or checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from warmup.errors import FieldProblem

# ModelConfig fields that are not LoRA settings: they belong elsewhere in a spec (model, model_init_kwargs).
NOT_PEFT = frozenset(
    {
        "model_name_or_path",
        "model_revision",
        "dtype",
        "trust_remote_code",
        "attn_implementation",
        "load_in_8bit",
        "load_in_4bit",
        "bnb_4bit_quant_type",
        "use_bnb_nested_quant",
        "bnb_4bit_quant_storage",
    }
)


def peft_fields() -> set[str]:
    """The keys a spec's `peft` block may hold: TRL ModelConfig's LoRA fields (and `use_peft`)."""
    from trl import ModelConfig

    return {f.name for f in dataclasses.fields(ModelConfig)} - NOT_PEFT


def peft_problems(peft: dict[str, Any] | None) -> list[FieldProblem]:
    """What is wrong with a spec's `peft` block, as TRL would read it (empty when it is fine or absent)."""
    if peft is None:
        return []
    known = peft_fields()
    problems = [
        FieldProblem(
            f"peft.{name}",
            "not a LoRA setting of trl.ModelConfig (known: " + ", ".join(sorted(known)) + ")",
        )
        for name in peft
        if name not in known
    ]
    if peft.get("use_peft") is False:
        problems.append(
            FieldProblem(
                "peft.use_peft", "use_peft is false: drop the peft block, the job trains every weight"
            )
        )
    if problems:
        return problems
    try:
        lora_config(peft)
    except (TypeError, ValueError) as error:
        problems.append(FieldProblem("peft", f"peft refuses these LoRA settings: {error}"))
    return problems


def lora_config(peft: dict[str, Any]) -> Any:
    """The `peft.LoraConfig` TRL's scripts pass to the trainer for these settings (a fresh object per call:
    trainers edit it, e.g. SFT adds `lm_head` to `modules_to_save` when it adds tokens)."""
    from trl import ModelConfig, get_peft_config

    settings = {name: value for name, value in peft.items() if name != "use_peft"}
    return get_peft_config(ModelConfig(use_peft=True, **settings))
