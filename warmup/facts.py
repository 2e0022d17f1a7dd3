"""Data facts read from the dataset itself, tokenized as the job's TRL trainer tokenizes it.

`dataset_facts(job, dataset)` reads a local dataset (a JSON / JSONL / Parquet / CSV / Arrow file, a
`datasets.save_to_disk` directory, a directory of data files, or the job's own `dataset_name` /
`datasets` when they resolve locally: nothing is downloaded), runs every example through the
preprocessing of the job's trainer in TRL 1.16 with the model's own tokenizer and chat template, and
returns the facts the planner needs (`DataFacts`) together with the token length of every row in
dataset order, for whoever needs more than the summary.

Exactness: the calls are TRL's own (`apply_chat_template` / the tokenizer's `__call__` with the
arguments each trainer passes, TRL's `is_conversational`, `extract_prompt`, `maybe_convert_to_chatml`,
`common_prefix_length`, and its packing functions), batched instead of one example at a time; the
rules between them (EOS appended to plain text, the prompt / completion split, which examples a trainer
drops) follow each trainer's `_prepare_dataset`. `tests/integration/planner/test_dataset_facts.py` holds the
lengths to the ones TRL's trainers produce on the same data.

Speed and memory: the dataset is streamed in Arrow batches (a few MB in memory at a time); batches
are tokenized in threads, one per core, with the tokenizer's Rust fast path (which releases the GIL),
and chat templates are rendered directly where transformers' preparation of the messages would change
nothing. The lengths are kept as 4-byte integers (40 MB for 10 million rows).

This module imports TRL, transformers and datasets only when facts are computed: it stays out of the
way of what a training pod imports.
"""

from __future__ import annotations

import array
import dataclasses
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from warmup.errors import DatasetError, SpecError
from warmup.spec import DataFacts, Spec
from warmup.trainers.record import TrainerFamily
from warmup.trainers.registry import family
from warmup.trl_args import truncation_slice

# Rows per batch: large enough for the tokenizer's batch path, small enough to bound memory.
BATCH_ROWS = 1000
# Past this many distinct lengths the histogram rounds lengths down (never up: the planner reads the
# shortest lengths as lower bounds, and rounding down only ever lists more shapes).
MAX_HISTOGRAM_KEYS = 512
# Below this many examples one thread does the work: a second tokenizer costs more than it saves.
PARALLEL_FROM = 20_000
DATA_FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}

Progress = Callable[[int, int | None], None]  # (examples done, examples in all or None)


@dataclasses.dataclass
class SplitFacts:
    """One split as the trainer sees it."""

    split: str  # the dataset's split name
    examples: int  # examples read from the dataset
    dropped: int  # examples the trainer's own preparation drops (prompt alone fills max_length, ...)
    # Token length of every row the trainer keeps, in dataset order: SFT one per example, DPO and Reward
    # two per example (chosen, then rejected), KTO one per unpaired example; GRPO / RLOO / distillation
    # have no rows before generation (see prompt_lengths). Untruncated: the planner applies max_length.
    lengths: array.array[int]
    # Tokens of each kept example's prompt as the trainer splits it (chat-templated, generation prompt
    # included), in dataset order; None for data without prompts.
    prompt_lengths: array.array[int] | None
    # SFT with packing: the length of every packed row TRL builds (these are the rows batches are made of).
    packed_lengths: array.array[int] | None = None

    @property
    def kept(self) -> int:
        return self.examples - self.dropped

    @property
    def rows(self) -> array.array[int]:
        """The rows batches are made of: packed rows when packing, else the kept rows."""
        return self.packed_lengths if self.packed_lengths is not None else self.lengths


@dataclasses.dataclass
class DatasetFacts:
    """What `dataset_facts` found: the planner's facts and the per-row lengths behind them."""

    data: DataFacts
    train: SplitFacts
    eval: SplitFacts | None
    source: str
    sample: int | None  # examples read per split when --sample limited it (the facts are then estimates)
    seconds: float  # the whole call: loading the tokenizer and TRL's config included
    read_seconds: float  # reading and tokenizing the examples
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def examples(self) -> int:
        return self.train.examples + (self.eval.examples if self.eval else 0)

    @property
    def rate(self) -> float:
        """Examples read and tokenized per second."""
        return self.examples / max(self.read_seconds, 1e-9)

    def data_block(self) -> str:
        """The facts as a `data:` block to paste into a spec (YAML)."""
        import yaml

        header = [
            f"# data facts of {self.source}: {self.examples} examples read, tokenized as TRL's trainer does "
            f"({self.rate:,.0f} examples/s)",
        ]
        if self.sample is not None:
            header.append(
                f"# ESTIMATE from the first {self.sample} examples of each split (--sample): lengths outside "
                "them are not covered"
            )
        header += [f"# {note}" for note in self.notes]
        body = yaml.safe_dump({"data": self.data.model_dump(exclude_none=True)}, sort_keys=False)
        return "\n".join(header) + "\n" + str(body)


# --- the public entry point --------------------------------------------------------------------------


def dataset_facts(
    job: Spec | str | Path | dict[str, Any],
    dataset: str | Path | None = None,
    *,
    selection: dict[str, Any] | None = None,
    sample: int | None = None,
    trainer: str | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> DatasetFacts:
    """Read `dataset` (or the job's own dataset selection) and compute its facts for the job's trainer.

    `job` is a Spec, or a spec / TRL config file or mapping (then its `dataset_name`, `datasets`,
    splits and `dataset:` are read too; for a Spec, `selection` gives them); `trainer` names the
    trainer of a TRL config that does not say.
    `sample` reads at most that many examples per split and marks the facts as an estimate.
    """
    from warmup.spec import read_job
    from warmup.trl_args import resolve_trainer_args

    started = time.monotonic()
    if sample is not None and sample < 1:
        raise SpecError(f"--sample must be at least 1, got {sample}", loc="sample")
    selection = dict(selection or {})
    if isinstance(job, Spec):
        spec = job
    else:
        loaded = read_job(job, trainer=trainer)
        spec, selection = loaded.spec, {**loaded.selection, **selection}
        dataset = (
            dataset if dataset is not None else loaded.dataset if isinstance(loaded.dataset, str) else None
        )
        sample = sample if sample is not None else loaded.sample
    if dataset is not None:
        selection = {**selection, "dataset": str(dataset)}
    args = resolve_trainer_args(spec)
    splits = open_splits(selection, evaluates=_evaluates(args))
    recipe = _Recipe.for_job(spec, args)
    reading = time.monotonic()
    train = _read_split(recipe, splits.train, splits.train_split, sample, workers, progress)
    evaluation = None
    if splits.eval is not None:
        evaluation = _read_split(recipe, splits.eval, splits.eval_split or "test", sample, workers, progress)
    read_seconds = time.monotonic() - reading
    notes = list(splits.notes)
    data = _summarize(recipe, train, evaluation, sample, notes)
    return DatasetFacts(
        data=data,
        train=train,
        eval=evaluation,
        source=splits.source,
        sample=sample,
        seconds=time.monotonic() - started,
        read_seconds=read_seconds,
        notes=notes,
    )


def _evaluates(args: Any) -> bool:
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    return strategy != "no" or bool(getattr(args, "eval_on_start", False))


# --- opening the dataset -------------------------------------------------------------------------------


@dataclasses.dataclass
class Splits:
    source: str
    train: Any  # a datasets Dataset or IterableDataset
    train_split: str
    eval: Any | None
    eval_split: str | None
    notes: list[str]


def open_splits(selection: dict[str, Any], *, evaluates: bool) -> Splits:
    """The train (and, when the job evaluates, eval) split of the dataset a selection names.

    `selection` holds `dataset` (a local path given with --dataset or `dataset:`) or TRL's script keys:
    `dataset_name`, `dataset_config`, `dataset_train_split`, `dataset_test_split`, `datasets`,
    `streaming`, `test_split_size`.
    """
    train_split = selection.get("dataset_train_split") or "train"
    test_split = selection.get("dataset_test_split") or "test"
    notes: list[str] = []
    with _offline():
        if selection.get("dataset"):
            source = str(selection["dataset"])
            named = selection.get("dataset_name")
            if named and Path(str(named)).exists():  # the facts come from --dataset, but `trl` will load this
                _load_named(str(named), selection.get("dataset_config"))
            loaded = _load_local(source, name=None)
        elif selection.get("datasets"):
            source = "datasets: " + ", ".join(str(d.get("path")) for d in selection["datasets"])
            loaded = _load_mixture(selection)
        elif selection.get("dataset_name"):
            source = str(selection["dataset_name"])
            loaded = _load_named(source, selection.get("dataset_config"))
        else:
            raise DatasetError(
                "no dataset to read: pass --dataset PATH (a JSON/JSONL/Parquet/CSV file, a save_to_disk directory), "
                "or set dataset_name / datasets in the config to a dataset that is on this machine",
                loc="dataset",
            )
    if train_split not in loaded:
        raise DatasetError(
            f"{source} has no split {train_split!r} (splits: {', '.join(loaded) or 'none'}); "
            "set dataset_train_split to one of them",
            loc="dataset_train_split",
        )
    evaluation = None
    if evaluates:
        if test_split in loaded:
            evaluation = loaded[test_split]
        else:
            notes.append(
                f"the job evaluates but {source} has no split {test_split!r}: no eval facts (TRL's script would fail "
                f"to find it too; set dataset_test_split)"
            )
    return Splits(
        source=source,
        train=loaded[train_split],
        train_split=train_split,
        eval=evaluation,
        eval_split=test_split if evaluation is not None else None,
        notes=notes,
    )


class _offline:
    """Nothing is downloaded: the Hub is switched off in datasets and huggingface_hub for the duration."""

    def __enter__(self) -> None:
        import datasets.config
        import huggingface_hub.constants

        self.saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
        datasets.config.HF_HUB_OFFLINE = True
        huggingface_hub.constants.HF_HUB_OFFLINE = True

    def __exit__(self, *_: object) -> None:
        import datasets.config
        import huggingface_hub.constants

        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = self.saved


def _load_local(source: str, name: str | None) -> dict[str, Any]:
    import datasets

    path = Path(source).expanduser()
    if not path.exists():
        raise DatasetError(f"dataset {source} does not exist", loc="dataset")
    try:
        if path.is_file():
            builder = DATA_FILE_BUILDERS.get("".join(path.suffixes[-1:]).lower())
            if builder is None:
                raise DatasetError(
                    f"dataset {source}: unknown file type {path.suffix!r}; expected one of "
                    f"{', '.join(sorted(DATA_FILE_BUILDERS))}, or a directory",
                    loc="dataset",
                )
            return dict(datasets.load_dataset(builder, data_files={"train": str(path)}, streaming=True))
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return dict(datasets.load_dataset(str(path), name=name, streaming=True))
    except DatasetError:
        raise
    except Exception as error:  # datasets raises many kinds; all mean the same to the user
        raise DatasetError(f"cannot read dataset {source}: {_first_line(error)}", loc="dataset") from None


def _load_named(name: str, config: str | None) -> dict[str, Any]:
    """`dataset_name` as TRL's scripts load it, `load_dataset(dataset_name, name=dataset_config)`, from this machine
    only: a local folder, or a Hub name in the datasets cache. What `trl` cannot load is refused with the form it can
    (a data file is no `dataset_name`: `load_dataset` takes a folder or a Hub name)."""
    import datasets

    local = Path(name).exists()  # read as it is written: `trl` neither expands `~` nor looks anywhere else
    try:
        # Streaming finds the same files as TRL's default (both resolve them before reading) and reads lazily.
        return dict(datasets.load_dataset(name, name=config, streaming=local))
    except Exception as error:
        raise DatasetError(_not_for_trl(name, error, local), loc="dataset_name") from None


def _not_for_trl(name: str, error: BaseException, local: bool) -> str:
    path = Path(name)
    fails = f"datasets.load_dataset({name!r}), as `trl` calls it, fails ({_first_line(error).rstrip('.')})"
    if path.is_file():
        builder = DATA_FILE_BUILDERS.get(path.suffix.lower(), "json")
        return (
            f"{name} is a file, which `trl` cannot load: {fails}. dataset_name takes a folder or a Hub name: put the "
            f"file in a folder of its own and set `dataset_name: FOLDER`, or list it under `datasets:` as "
            f"`- path: {builder}` with `data_files: {name}`"
        )
    if local and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        return (
            f"{name} is a datasets.save_to_disk directory, which `trl` cannot load: {fails}. Write it out as data "
            "files (`load_from_disk(DIR)['train'].to_json('FOLDER/train.jsonl')`) and set `dataset_name: FOLDER`"
        )
    if local:
        return f"{name}: {fails}"
    return (
        f"{name!r} is neither a local path nor in this machine's datasets cache "
        f"({_first_line(error)}); nothing is downloaded: pass --dataset PATH"
    )


def _load_mixture(selection: dict[str, Any]) -> dict[str, Any]:
    """`datasets:` through TRL's own `get_dataset` (fractions, columns, test_split_size as TRL applies them)."""
    from trl import DatasetMixtureConfig, get_dataset

    mixture = DatasetMixtureConfig(
        datasets=[dict(d) for d in selection["datasets"]],
        streaming=bool(selection.get("streaming", False)),
        test_split_size=selection.get("test_split_size"),
    )
    try:
        return dict(get_dataset(mixture))
    except Exception as error:
        raise DatasetError(
            f"cannot load the `datasets:` mixture from this machine ({_first_line(error)}); nothing is downloaded: "
            "pass --dataset PATH",
            loc="datasets",
        ) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


# --- tokenizing as the trainer does ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Recipe:
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
    def for_job(cls, spec: Spec, args: Any) -> _Recipe:
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


@dataclasses.dataclass
class _BatchRows:
    lengths: list[int]
    prompts: list[int] | None
    dropped: int
    examples: int


class _Tokenize:
    """Batched versions of the tokenizer calls TRL's trainers make, one example at a time, in 1.16."""

    def __init__(self, recipe: _Recipe) -> None:
        from transformers import AutoTokenizer

        self.recipe = recipe
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(recipe.model)
        except Exception as error:
            raise DatasetError(
                f"cannot load the tokenizer of {recipe.model!r}: {_first_line(error)}", loc="model"
            ) from None
        if recipe.eos_token is not None:  # SFTTrainer sets it on the tokenizer before preparing data
            self.tokenizer.eos_token = recipe.eos_token
        self.backend = getattr(self.tokenizer, "_tokenizer", None) if self.tokenizer.is_fast else None
        self.checked = False
        self.renderer = _Renderer(self.tokenizer, recipe.chat_template)

    def text(self, texts: list[str]) -> list[list[int]]:
        """`processing_class(text=...)` (TRL's `_tokenize` for plain text): special tokens added."""
        return self._encode(texts, add_special_tokens=True)

    def chat(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        generation_prompt: bool,
        kwargs: list[dict[str, Any]],
    ) -> list[list[int]]:
        """`apply_chat_template(conversation, tokenize=True, ...)`: rendered, then encoded without special tokens.

        `kwargs` holds each example's own arguments (`tools`, `chat_template_kwargs`); examples that share
        them are rendered in one call.
        """
        rendered: list[str] = [""] * len(conversations)
        groups: dict[str, list[int]] = {}
        for index, own in enumerate(kwargs):
            groups.setdefault(repr(sorted(own.items())) if own else "", []).append(index)
        for indices in groups.values():
            texts = self.renderer.render(
                [conversations[i] for i in indices],
                generation_prompt=generation_prompt,
                kwargs=kwargs[indices[0]],
            )
            for i, text in zip(indices, texts, strict=True):
                rendered[i] = text
        return self._encode(rendered, add_special_tokens=False)

    def _encode(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        if not texts:
            return []
        if self.backend is not None:
            ids = [
                encoding.ids
                for encoding in self.backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
            ]
            if not self.checked:
                # The Rust backend directly is the tokenizer's own fast path; hold it to __call__ once, on a few
                # texts, and take the slow path for good if a tokenizer adds something in Python.
                probe = self.tokenizer(texts[:8], add_special_tokens=add_special_tokens)["input_ids"]
                if list(probe) != ids[:8]:
                    self.backend = None
                    return self._encode(texts, add_special_tokens=add_special_tokens)
                self.checked = True
            return ids
        return list(self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"])

    def assistant_masks(
        self, conversations: list[list[dict[str, Any]]], kwargs: list[dict[str, Any]]
    ) -> list[list[int]]:
        """`return_assistant_tokens_mask=True` (SFT's assistant_only_loss), one call per example as TRL makes it."""
        masks = []
        for conversation, own in zip(conversations, kwargs, strict=True):
            out = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                chat_template=self.recipe.chat_template,
                **own,
            )
            masks.append(list(out["assistant_masks"]))
        return masks


class _Renderer:
    """`apply_chat_template(..., tokenize=False)`, with the template rendered directly where that is the same.

    transformers prepares each conversation before rendering it (message objects to dicts, keys with None
    values dropped, everything rebuilt from plain JSON types, reasoning fields aliased), which costs more than
    the rendering. For messages that are already plain dicts of strings with no None and no reasoning field,
    that preparation returns them unchanged, so the compiled template renders them directly with the arguments
    transformers passes. The first conversation of every batch is rendered both ways; if they ever differ,
    every later conversation takes transformers' own path.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.direct = True
        from warmup._compat import transformers as compat_transformers

        compiler = compat_transformers.chat_template_compiler()
        if compiler is None:  # another transformers: its own path only
            self.direct = False
        else:
            self.reasoning, self.compile = compiler

    def render(
        self, conversations: list[list[dict[str, Any]]], *, generation_prompt: bool, kwargs: dict[str, Any]
    ) -> list[str]:
        def hf(batch: list[list[dict[str, Any]]]) -> list[str]:
            return self.tokenizer.apply_chat_template(  # type: ignore[no-any-return]
                batch,
                tokenize=False,
                add_generation_prompt=generation_prompt,
                chat_template=self.chat_template,
                **kwargs,
            )

        if not self.direct or kwargs or not conversations:
            return hf(conversations)
        template = self.compile(self.tokenizer.get_chat_template(self.chat_template, None))
        context = {**self.tokenizer.special_tokens_map, "tools": None, "documents": None}
        out: list[str] = []
        plain = self._plain
        for conversation in conversations:
            if plain(conversation):
                out.append(
                    template.render(messages=conversation, add_generation_prompt=generation_prompt, **context)
                )
            else:
                out.append(hf([conversation])[0])
        if out[0] != hf(conversations[:1])[0]:
            self.direct = False
            return hf(conversations)
        return out

    def _plain(self, conversation: Any) -> bool:
        if type(conversation) is not list or not conversation:
            return False
        for message in conversation:
            if type(message) is not dict:
                return False
            for key, value in message.items():
                if type(value) is not str or type(key) is not str or key in self.reasoning:
                    return False
        return True


def _prompt_plus(key: str) -> Callable[[dict[str, Any]], Any]:
    """The prompt followed by the example's `key` (a completion): text or messages, joined as TRL joins them."""

    def part(example: dict[str, Any]) -> Any:
        return example["prompt"] + example[key]

    return part


def _example_kwargs(example: dict[str, Any]) -> dict[str, Any]:
    """The per-example chat-template arguments SFT / DPO / KTO / Reward pass (`tools`, `chat_template_kwargs`)."""
    import json

    tools = example.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    own = {"tools": tools} if tools is not None else {}
    own.update(example.get("chat_template_kwargs") or {})
    return own


class _Rows:
    """Tokenizes batches of one split; dataset-level decisions come from the split's first example, as TRL's do."""

    def __init__(self, recipe: _Recipe) -> None:
        self.recipe = recipe
        self.tok = _Tokenize(recipe)
        self.first: dict[str, Any] | None = None

    def __call__(self, batch: list[dict[str, Any]]) -> _BatchRows:
        from trl.data_utils import is_conversational

        if not batch:
            return _BatchRows([], [], 0, 0)
        if self.first is None:
            self.first = batch[0]
        rows = self.recipe.family.dataset_rows
        if rows == "sft":
            return self._sft(batch)
        if rows == "preference":
            return self._preference(batch, is_conversational)
        if rows == "reward":
            return self._reward(batch, is_conversational)
        return self._prompts(batch, is_conversational)

    # SFTTrainer._prepare_dataset
    def _sft(self, batch: list[dict[str, Any]]) -> _BatchRows:
        from trl.data_utils import (
            common_prefix_length,
            is_conversational,
            is_conversational_from_value,
            maybe_convert_to_chatml,
        )

        recipe = self.recipe
        first = self.first or batch[0]
        if "input_ids" in first:  # already tokenized: TRL takes it as it is
            return _BatchRows([len(e["input_ids"]) for e in batch], None, 0, len(batch))
        if is_conversational_from_value(first):
            batch = [maybe_convert_to_chatml(dict(e)) for e in batch]
            first = maybe_convert_to_chatml(dict(first))
        if not is_conversational(first):
            eos = self.tok.tokenizer.eos_token or ""
            field = recipe.dataset_text_field
            fixed = []
            for example in batch:
                example = dict(example)
                if field in example and not example[field].endswith(eos):
                    example[field] = example[field] + eos
                elif "completion" in example and not example["completion"].endswith(eos):
                    example["completion"] = example["completion"] + eos
                fixed.append(example)
            batch = fixed
        completion_only = (
            recipe.completion_only_loss
            if recipe.completion_only_loss is not None
            else ("prompt" in first and "completion" in first)
        )
        lengths: list[int] = []
        prompts: list[int] = []
        masks: list[list[int] | None] = [None] * len(batch)
        has_prompt = ["prompt" in e for e in batch]
        conversational = [is_conversational(e) for e in batch]
        if any(has_prompt):
            prompt_ids = self._split_ids(
                batch,
                [i for i, p in enumerate(has_prompt) if p],
                conversational,
                lambda e: e["prompt"],
                prompt=True,
            )
            full_ids = self._split_ids(
                batch,
                [i for i, p in enumerate(has_prompt) if p],
                conversational,
                lambda e: e["prompt"] + e["completion"],
                prompt=False,
            )
        whole: dict[int, int] = {}
        lm = [i for i, p in enumerate(has_prompt) if not p]
        if lm:
            chat = [i for i in lm if conversational[i]]
            plain = [i for i in lm if not conversational[i]]
            if chat:
                ids = self.tok.chat(
                    [batch[i]["messages"] for i in chat],
                    generation_prompt=False,
                    kwargs=[_example_kwargs(batch[i]) for i in chat],
                )
                whole.update({i: len(x) for i, x in zip(chat, ids, strict=True)})
                if recipe.assistant_only_loss:
                    found = self.tok.assistant_masks(
                        [batch[i]["messages"] for i in chat], [_example_kwargs(batch[i]) for i in chat]
                    )
                    for i, mask in zip(chat, found, strict=True):
                        masks[i] = mask
            if plain:
                ids = self.tok.text([batch[i][recipe.dataset_text_field] for i in plain])
                whole.update({i: len(x) for i, x in zip(plain, ids, strict=True)})
        dropped = 0
        for i, example in enumerate(batch):
            if has_prompt[i]:
                p_ids, f_ids = prompt_ids[i], full_ids[i]
                length = len(f_ids)
                prompt_len = common_prefix_length(p_ids, f_ids)
                if recipe.assistant_only_loss and conversational[i]:
                    masks[i] = self.tok.assistant_masks(
                        [example["prompt"] + example["completion"]], [_example_kwargs(example)]
                    )[0]
            else:
                length, prompt_len = whole[i], 0
            if self._sft_drops(length, prompt_len if completion_only else 0, masks[i]):
                dropped += 1
                continue
            lengths.append(length)
            if has_prompt[i]:
                prompts.append(prompt_len)
        return _BatchRows(lengths, prompts if any(has_prompt) else None, dropped, len(batch))

    def _split_ids(
        self,
        batch: list[dict[str, Any]],
        indices: list[int],
        conversational: list[bool],
        part: Callable[[dict[str, Any]], Any],
        *,
        prompt: bool,
    ) -> dict[int, list[int]]:
        """Token ids of `part(example)` for the examples at `indices`: chat-templated (the prompt alone with the
        generation prompt) or plain text, as TRL's tokenize functions do."""
        out: dict[int, list[int]] = {}
        chat = [i for i in indices if conversational[i]]
        plain = [i for i in indices if not conversational[i]]
        if chat:
            ids = self.tok.chat(
                [part(batch[i]) for i in chat],
                generation_prompt=prompt,
                kwargs=[_example_kwargs(batch[i]) for i in chat],
            )
            out.update(zip(chat, ids, strict=True))
        if plain:
            out.update(zip(plain, self.tok.text([part(batch[i]) for i in plain]), strict=True))
        return out

    def _sft_drops(self, length: int, masked_prefix: int, assistant: list[int] | None) -> bool:
        """SFT drops an example whose labels are all -100 after truncation (only when it truncates: no packing)."""
        recipe = self.recipe
        if recipe.max_length is None or self._packing:
            return False
        window = range(length)[truncation_slice(recipe.max_length, recipe.truncation_mode)]
        return not any(i >= masked_prefix and (assistant is None or assistant[i]) for i in window)

    _packing = False  # set per split by _read_split

    # DPOTrainer / KTOTrainer._prepare_dataset
    def _preference(
        self, batch: list[dict[str, Any]], is_conversational: Callable[[dict[str, Any]], bool]
    ) -> _BatchRows:
        from trl.data_utils import common_prefix_length, extract_prompt

        recipe = self.recipe
        first = self.first or batch[0]
        if "prompt" not in first:
            batch = [{**e, **extract_prompt(e)} for e in batch]
            first = {**first, **extract_prompt(first)}
        completions = list(recipe.family.completion_columns)
        if recipe.family.unpairs_preferences and "chosen" in first and "rejected" in first:
            # unpair_preference_dataset, per batch: every chosen row, then every rejected row
            batch = [{**e, "completion": e["chosen"], "label": True} for e in batch] + [
                {**e, "completion": e["rejected"], "label": False} for e in batch
            ]
        if not is_conversational(first):
            eos = self.tok.tokenizer.eos_token or ""
            batch = [
                {**e, **{key: e[key] if e[key].endswith(eos) else e[key] + eos for key in completions}}
                for e in batch
            ]
        conversational = [is_conversational(e) for e in batch]
        everyone = list(range(len(batch)))
        prompt_ids = self._split_ids(batch, everyone, conversational, lambda e: e["prompt"], prompt=True)
        full = {
            key: self._split_ids(batch, everyone, conversational, _prompt_plus(key), prompt=False)
            for key in completions
        }
        lengths: list[int] = []
        prompts: list[int] = []
        dropped = 0
        drops_long_prompts = recipe.max_length is not None and (
            recipe.family.drops_long_prompts or recipe.truncation_mode == "keep_start"
        )
        for i in everyone:
            prompt_len = min(common_prefix_length(prompt_ids[i], full[key][i]) for key in completions)
            if drops_long_prompts and prompt_len >= recipe.max_length:
                dropped += 1
                continue
            lengths += [len(full[key][i]) for key in completions]
            prompts.append(prompt_len)
        return _BatchRows(lengths, prompts, dropped, len(batch))

    # RewardTrainer._prepare_dataset
    def _reward(
        self, batch: list[dict[str, Any]], is_conversational: Callable[[dict[str, Any]], bool]
    ) -> _BatchRows:
        recipe = self.recipe
        first = self.first or batch[0]
        if "chosen_ids" in first and "rejected_ids" in first:
            pairs = [(len(e["chosen_ids"]), len(e["rejected_ids"])) for e in batch]
        else:
            if not is_conversational(first):
                eos = self.tok.tokenizer.eos_token or ""
                batch = [
                    {
                        **e,
                        **{
                            k: e[k] if e[k].endswith(eos) else e[k] + eos
                            for k in ("chosen", "rejected")
                            if k in e
                        },
                    }
                    for e in batch
                ]
            if "prompt" in first:
                batch = [
                    {**e, "chosen": e["prompt"] + e["chosen"], "rejected": e["prompt"] + e["rejected"]}
                    for e in batch
                ]
            conversational = [is_conversational(e) for e in batch]
            everyone = list(range(len(batch)))
            chosen = self._split_ids(batch, everyone, conversational, lambda e: e["chosen"], prompt=False)
            rejected = self._split_ids(batch, everyone, conversational, lambda e: e["rejected"], prompt=False)
            pairs = [(len(chosen[i]), len(rejected[i])) for i in everyone]
        lengths: list[int] = []
        dropped = 0
        for pair in pairs:
            if recipe.max_length is not None and max(pair) > recipe.max_length:
                dropped += 1  # RewardTrainer filters pairs with a row longer than max_length
                continue
            lengths += pair
        return _BatchRows(lengths, None, dropped, len(batch))

    # GRPOTrainer / RLOOTrainer / DistillationTrainer._tokenize_prompts
    def _prompts(
        self, batch: list[dict[str, Any]], is_conversational: Callable[[dict[str, Any]], bool]
    ) -> _BatchRows:
        if "prompt" not in batch[0]:
            raise DatasetError(
                f"the dataset has no 'prompt' column (columns: {', '.join(batch[0])}); TRL's {self.recipe.trainer} "
                "trainer generates from 'prompt'",
                loc="dataset",
            )
        prompts = [e["prompt"] for e in batch]
        if is_conversational({"prompt": prompts[0]}):
            ids = self.tok.chat(
                prompts,
                generation_prompt=True,
                kwargs=[dict(self.recipe.chat_template_kwargs)] * len(prompts),
            )
        else:
            ids = self.tok.text(prompts)
        lengths = [len(x) for x in ids]
        return _BatchRows([], lengths, 0, len(batch))


# --- reading a split --------------------------------------------------------------------------------------


def _batches(split: Any, sample: int | None) -> Iterator[Any]:
    """Batches of examples as Arrow tables (cheap to hand to a worker), at most `sample` examples in all."""
    left = sample
    for table in split.with_format("arrow").iter(batch_size=BATCH_ROWS):
        if left is not None:
            table = table.slice(0, left)
            left -= table.num_rows
        if table.num_rows:
            yield table
        if left is not None and left <= 0:
            return


def _split_size(split: Any) -> int | None:
    try:
        return len(split)
    except TypeError:  # an IterableDataset: its size is in the metadata when the builder recorded it
        info = getattr(split, "info", None)
        splits = getattr(info, "splits", None) or {}
        name = str(getattr(split, "split", "") or "train")
        found = splits.get(name) if hasattr(splits, "get") else None
        return getattr(found, "num_examples", None) or None


def _read_split(
    recipe: _Recipe,
    split: Any,
    name: str,
    sample: int | None,
    workers: int | None,
    progress: Progress | None,
) -> SplitFacts:
    total = _split_size(split)
    if sample is not None and total is not None:
        total = min(total, sample)
    packing = recipe.family.packs and (
        recipe.packing if name == "train" or recipe.eval_packing is None else recipe.eval_packing
    )
    lengths = array.array("I")
    prompts = array.array("I")
    has_prompts = False
    dropped = examples = 0
    batches = _batches(split, sample)
    first_batch = next(batches, None)
    if first_batch is None:
        raise DatasetError(f"split {name!r} of the dataset is empty", loc="dataset")
    first = first_batch.slice(0, 1).to_pylist()[0]
    count = workers if workers is not None else (os.cpu_count() or 1)
    parallel = count > 1 and (total is None or total >= PARALLEL_FROM)

    def results() -> Iterator[_BatchRows]:
        if not parallel:
            rows = _Rows(recipe)
            rows._packing = packing
            rows.first = first
            yield rows(first_batch.to_pylist())
            for batch in batches:
                yield rows(batch.to_pylist())
            return
        yield from _threaded(recipe, packing, first, [first_batch], batches, count)

    for done in results():
        lengths.extend(done.lengths)
        if done.prompts is not None:
            has_prompts = True
            prompts.extend(done.prompts)
        dropped += done.dropped
        examples += done.examples
        if progress is not None:
            progress(examples, total)
    if progress is not None:
        progress(examples, examples)  # done: the line ends
    facts = SplitFacts(
        split=name,
        examples=examples,
        dropped=dropped,
        lengths=lengths,
        prompt_lengths=prompts if has_prompts else None,
    )
    if packing:
        if recipe.max_length is None:
            raise SpecError(
                "packing needs max_length (TRL refuses packing with max_length: null)", loc="args.max_length"
            )
        facts.packed_lengths = packed_lengths(recipe, lengths)
    return facts


def _threaded(
    recipe: _Recipe, packing: bool, first: dict[str, Any], head: list[Any], batches: Iterator[Any], count: int
) -> Iterator[_BatchRows]:
    """Batches tokenized in `count` threads, results in order, a bounded number in flight.

    Threads, not processes: the tokenizer's Rust encoder releases the GIL (and spreads a batch over the cores), so
    one thread renders chat templates while another encodes; worker processes measured slower here, the batches'
    trip through pipes costing more system time than the rendering they took off this process.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()

    def run(batch: Any) -> _BatchRows:
        rows = getattr(local, "rows", None)
        if rows is None:
            rows = local.rows = _Rows(recipe)
            rows._packing = packing
            rows.first = first
        return rows(batch.to_pylist())

    pending: list[Any] = []
    with ThreadPoolExecutor(count) as pool:
        for batch in [*head, *batches]:
            pending.append(pool.submit(run, batch))
            if len(pending) >= 4 * count:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


# --- packing --------------------------------------------------------------------------------------------


def packed_lengths(recipe: _Recipe, lengths: array.array[int]) -> array.array[int]:
    """The rows TRL's `pack_dataset` builds from examples of these lengths, as SFTTrainer calls it.

    SFTTrainer shuffles (when shuffle_dataset) with its seed, then packs with `Dataset.map(batched=True)`:
    batches of 1000 examples, within `dataset_num_proc` contiguous shards. Each batch is packed here by
    TRL's own function on a table of placeholder tokens of the same lengths, so only one batch of tokens
    is ever in memory.
    """
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    from warmup._compat import trl as compat_trl

    order = np.frombuffer(lengths, dtype=np.uint32) if len(lengths) else np.zeros(0, dtype=np.uint32)
    if recipe.shuffle_dataset:
        order = order[np.random.default_rng(recipe.seed).permutation(len(order))]
    out = array.array("I")
    shards = max(1, min(recipe.dataset_num_proc or 1, len(order)))
    size, extra = divmod(len(order), shards)
    start = 0
    seq_length = int(recipe.max_length or 0)
    for shard in range(shards):
        stop = start + size + (1 if shard < extra else 0)
        for begin in range(start, stop, BATCH_ROWS):
            chunk = order[begin : min(begin + BATCH_ROWS, stop)]
            offsets = np.concatenate(([0], np.cumsum(chunk, dtype=np.int64))).astype(np.int64)
            values = pa.array(np.zeros(int(offsets[-1]), dtype=np.int8))
            table = pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), values)})
            packed = compat_trl.pack(table, seq_length, recipe.packing_strategy)
            column = packed.column("input_ids").combine_chunks()
            out.extend(int(n) for n in column.value_lengths().to_numpy(zero_copy_only=False))
        start = stop
    return out


# --- summarizing --------------------------------------------------------------------------------------


def _summarize(
    recipe: _Recipe, train: SplitFacts, evaluation: SplitFacts | None, sample: int | None, notes: list[str]
) -> DataFacts:
    splits = [s for s in (train, evaluation) if s is not None]
    rows = array.array("I")
    prompts = array.array("I")
    for split in splits:
        rows.extend(split.rows)
        if split.prompt_lengths is not None:
            prompts.extend(split.prompt_lengths)
    for split in splits:
        if split.dropped:
            notes.append(
                f"{split.dropped} of the {split.examples} examples of split {split.split!r} are dropped by the trainer's "
                "own preparation (see max_length): the counts are of the examples it keeps"
            )
    online = recipe.family.generates
    facts: dict[str, Any] = {
        "num_train_examples": _count(train, recipe) or None,
        "num_eval_examples": _count(evaluation, recipe) if evaluation is not None else None,
    }
    if train.packed_lengths is not None:
        facts["num_train_rows"] = len(train.packed_lengths) or None
    if evaluation is not None and evaluation.packed_lengths is not None:
        facts["num_eval_rows"] = len(evaluation.packed_lengths)
    if prompts:
        facts["max_prompt_tokens"] = max(prompts) or None
        facts["min_prompt_tokens"] = min(prompts) or None
    if rows and not online:
        facts["max_tokens"] = max(rows)
        facts["min_tokens"] = min(rows) or None
        histogram, step = length_histogram(rows)
        facts["length_histogram"] = histogram
        if step > 1:
            notes.append(
                f"length_histogram rounds lengths down to a multiple of {step} ({len(set(rows))} distinct lengths); "
                "max_tokens and min_tokens are exact"
            )
    if sample is not None:
        facts["estimated_from"] = sample
    return DataFacts.model_validate(facts)


def _count(split: SplitFacts | None, recipe: _Recipe) -> int:
    """Examples as the planner counts them: pairs for DPO / Reward, unpaired examples for KTO, kept examples
    (packed rows are counted apart: num_*_rows)."""
    if split is None:
        return 0
    return len(split.lengths) if recipe.family.unpairs_preferences else split.kept


def length_histogram(lengths: Iterable[int]) -> tuple[dict[int, int], int]:
    """{length: rows}, rounded down to a power-of-two step when there are more than MAX_HISTOGRAM_KEYS lengths."""
    exact = Counter(n for n in lengths if n > 0)
    step = 1
    histogram = exact
    while len(histogram) > MAX_HISTOGRAM_KEYS:
        step *= 2
        histogram = Counter()
        for length, count in exact.items():
            histogram[max(1, length // step * step)] += count
    return dict(sorted(histogram.items())), step


def progress_bar(stream: Any = None) -> Progress:
    """A progress line on stderr: examples tokenized, rate, and the share done when the size is known.

    Drawn at most twice a second from the first half second on, and ended when a split is done."""
    stream = stream or sys.stderr
    state: dict[str, float] = {"started": 0.0, "shown": 0.0}

    def show(done: int, total: int | None) -> None:
        now = time.monotonic()
        if not state["started"]:
            state["started"] = now
        finished = total is not None and done >= total
        if now - (state["shown"] or state["started"]) < 0.5 and not (finished and state["shown"]):
            return
        rate = done / max(now - state["started"], 1e-9)
        share = f" / {total} ({100 * done / total:.0f}%)" if total else ""
        print(f"\rtokenized {done}{share} examples, {rate:,.0f}/s", end="", file=stream, flush=True)
        state["shown"] = now
        if finished:
            print(file=stream, flush=True)
            state["started"], state["shown"] = 0.0, 0.0

    return show


__all__ = ["DatasetFacts", "SplitFacts", "dataset_facts", "length_histogram", "open_splits", "packed_lengths"]
