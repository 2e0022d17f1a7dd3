"""What reading a dataset needs of the job's trainer config: its tokenizing, dropping and packing settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from warmup.errors import SpecError
from warmup.job.spec import Spec
from warmup.trainers.record import TrainerFamily
from warmup.trainers.registry import family


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a worker needs to tokenize batches as the job's trainer does (picklable)."""

    trainer: str
    model: str
    max_length: int | None
    truncation_mode: str
    eos_token: str | None
    chat_template: str | None  # SFTConfig.chat_template_path's template, read
    dataset_text_field: str
    completion_only_loss: bool | None
    assistant_only_loss: bool
    chat_template_kwargs: dict[str, Any]
    packing: bool
    eval_packing: bool | None
    packing_strategy: str
    shuffle_dataset: bool
    seed: int
    dataset_num_proc: int | None

    @property
    def family(self) -> TrainerFamily:
        return family(self.trainer)

    @classmethod
    def for_job(cls, spec: Spec, args: Any) -> Recipe:
        def arg(name: str, default: Any = None) -> Any:
            return getattr(args.config, name, default)

        template = None
        template_path = arg("chat_template_path")
        if template_path is not None:
            if not (Path(template_path).is_file() and str(template_path).endswith((".jinja", ".j2"))):
                raise SpecError(
                    "chat_template_path names a tokenizer to clone a template from; warmup facts reads only a "
                    ".jinja / .j2 template file",
                    loc="args.chat_template_path",
                )
            template = Path(template_path).read_text(encoding="utf-8")
        kwargs = arg("chat_template_kwargs") or {}
        if isinstance(kwargs, str):
            import json

            kwargs = json.loads(kwargs)
        return cls(
            trainer=spec.trainer,
            model=spec.model,
            max_length=arg("max_length"),
            truncation_mode=arg("truncation_mode", "keep_start") or "keep_start",
            eos_token=arg("eos_token"),
            chat_template=template,
            dataset_text_field=arg("dataset_text_field", "text") or "text",
            completion_only_loss=arg("completion_only_loss"),
            assistant_only_loss=bool(arg("assistant_only_loss", False)),
            chat_template_kwargs=dict(kwargs),
            packing=bool(arg("packing", False)),
            eval_packing=arg("eval_packing"),
            packing_strategy=arg("packing_strategy", "bfd") or "bfd",
            shuffle_dataset=bool(arg("shuffle_dataset", False)),
            seed=int(arg("seed", 42)),
            dataset_num_proc=arg("dataset_num_proc"),
        )
