"""Opening a dataset as `trl` opens it: a local file or folder, a `dataset_name`, a `datasets:` mixture.

Nothing is downloaded: the Hub is switched off while a dataset opens, so a name resolves only to a local
folder or the datasets cache.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from warmup.errors import DatasetError

DATA_FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


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
        raise DatasetError(f"cannot read dataset {source}: {first_line(error)}", loc="dataset") from None


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
    fails = f"datasets.load_dataset({name!r}), as `trl` calls it, fails ({first_line(error).rstrip('.')})"
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
        f"{name!r} is neither a local path (a relative one is read from the directory `trl` runs in, as here: "
        f"{os.getcwd()}) nor in this machine's datasets cache ({first_line(error)}); nothing is downloaded: "
        "pass --dataset PATH"
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
        missing = [
            p
            for p in _mixture_paths(selection["datasets"])
            if not Path(p).is_absolute() and not Path(p).exists()
        ]
        advice = (
            f"{missing[0]} is relative, read from the directory `trl` runs in, as here ({os.getcwd()}): run this "
            "command where `trl` runs, or make the path absolute"
            if missing
            else "nothing is downloaded: pass --dataset PATH"
        )
        raise DatasetError(
            f"cannot load the `datasets:` mixture from this machine ({first_line(error)}); {advice}",
            loc="datasets",
        ) from None


def _mixture_paths(entries: list[Any]) -> list[str]:
    """The local paths a `datasets:` mixture names (`data_files`, `data_dir`; `path` is a builder or a Hub name)."""
    paths: list[str] = []
    for entry in entries:
        entry = entry if isinstance(entry, dict) else {}
        for value in (entry.get("data_dir"), entry.get("data_files")):
            values = value.values() if isinstance(value, dict) else [value]
            for item in values:
                paths += [
                    str(i) for i in (item if isinstance(item, list) else [item]) if isinstance(i, str) and i
                ]
    return paths


def first_line(error: BaseException) -> str:
    """An error in one line: its type and the first line of its message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
