"""The service's settings: one class for `serve`, `worker`, `gc` and `token`.

Each value comes from the command line, else a `WARMUP_*` environment variable, else its default.
The command-line options are generated from the fields below (`add_options`), so a setting is
written once: its name, type, default, help and the commands that take it. Unsafe combinations are
refused when the settings are built, before anything starts.

Server-side only: pydantic-settings is not in the base install a training pod has.
"""

from __future__ import annotations

import argparse
import ipaddress
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from warmup.errors import WarmupError

LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1"}
Command = Literal["serve", "worker", "gc", "token"]
STORAGE: tuple[Command, ...] = ("serve", "worker", "gc", "token")


@dataclass(frozen=True)
class Option:
    """Where a setting appears on the command line: the commands that take it, and its flag when the
    flag is not the field's name in kebab case."""

    commands: tuple[Command, ...]
    flag: str | None = None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _world_sizes(value: Any) -> Any:
    """`1,2,4` from a flag or the environment; a sequence from code."""
    if not isinstance(value, str):
        return value
    try:
        sizes = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise ValueError(f"world sizes are positive numbers like 1,2,4, not {value!r}")
    return tuple(sizes)


WorldSizes = Annotated[tuple[int, ...], NoDecode, BeforeValidator(_world_sizes)]


class Settings(BaseSettings):
    """Everything the service's processes need. Defaults give the embedded setup under `data_dir`."""

    model_config = SettingsConfigDict(env_prefix="WARMUP_", extra="forbid")

    # --- where the state lives (every command) ---
    data_dir: Annotated[Path, Option(STORAGE)] = Field(
        Path("./data"), description="embedded setup: SQLite file and blob directory here (default ./data)"
    )
    database_url: Annotated[str | None, Option(STORAGE)] = Field(
        None,
        description="SQLAlchemy URL of the service's database, e.g. postgresql://... (default: SQLite under data_dir)",
    )
    store_url: Annotated[str | None, Option(("serve", "worker", "gc"), flag="--store")] = Field(
        None, description="blob store: s3://bucket/prefix or a directory (default: data_dir/blobs)"
    )

    # --- the API server ---
    host: Annotated[str, Option(("serve",))] = Field("127.0.0.1", description="address to listen on")
    port: Annotated[int, Option(("serve",))] = Field(8000, ge=0, le=65535, description="port to listen on")
    auth: Annotated[Literal["required", "off", "auto"], Option(("serve",))] = Field(
        "auto", description="bearer tokens: 'auto' requires them unless listening on loopback only"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies get 413")
    presign_endpoint_url: str | None = Field(
        None,
        description="S3 endpoint written into presigned blob URLs, where pods reach the store at another "
        "address than this server does; default: the server's own (AWS_ENDPOINT_URL or AWS's)",
    )
    presign_expiry_s: int = Field(
        3600, ge=60, le=7 * 24 * 3600, description="lifetime of presigned blob URLs"
    )
    max_signatures: int = Field(2048, ge=1, description="a spec planning more is refused")
    public_url: str | None = Field(None, description="base URL pods use to reach this server's blob route")
    metrics_public: bool = Field(
        True, description="/metrics answers without a token (aggregate numbers only); false: it needs 'read'"
    )
    store_check_interval_s: float = Field(
        0.0,
        ge=0,
        description="every this many seconds the server compares the store's listing with the blobs entries "
        "list and acts on the missing and cut-short ones as `warmup store check --quick` does; 0: never",
    )
    log_format: Literal["text", "kv", "json"] = Field(
        "text", description="log lines as text, key=value or JSON (secrets are always redacted)"
    )
    log_level: str = Field("INFO", description="level of the service's logs")

    # --- workers ---
    lease_s: Annotated[float, Option(("worker",), flag="--lease")] = Field(
        120.0, gt=0, description="task lease in seconds (renewed by heartbeats)"
    )
    backend: Annotated[Literal["inductor", "neuron"], Option(("worker",))] = Field(
        "inductor", description="compile backend this worker warms for"
    )
    device: Annotated[Literal["cpu", "cuda", "neuron"] | None, Option(("worker",))] = Field(
        None, description="default: neuron for the neuron backend, cuda when available, else cpu"
    )
    pool: Annotated[str | None, Option(("worker",))] = Field(
        None, description="name of the worker pool this worker serves"
    )
    concurrency: Annotated[int, Option(("worker",))] = Field(
        1, ge=1, description="worker processes on this host (on Neuron: 1, 2 or 4 core groups)"
    )
    task_timeout_s: Annotated[float, Option(("worker",), flag="--task-timeout")] = Field(
        3600.0, gt=0, description="time limit of one rehearsal"
    )
    grace_s: Annotated[float, Option(("worker",), flag="--grace")] = Field(
        60.0, ge=0, description="on SIGTERM, time to finish the current task"
    )
    exit_when_idle: Annotated[bool, Option(("worker",))] = Field(
        False, description="exit once no task is waiting"
    )
    max_attempts: Annotated[int, Option(("worker",))] = Field(
        3, ge=1, description="tries of a task that crashes or times out"
    )
    retry_delay_s: Annotated[float, Option(("worker",), flag="--retry-delay")] = Field(
        30.0, ge=0, description="seconds before a retry (doubling)"
    )
    poll_interval_s: Annotated[float, Option(("worker",), flag="--poll-interval")] = Field(
        2.0, gt=0, description="seconds between claims when idle"
    )
    world_sizes: Annotated[WorldSizes, Option(("worker",))] = Field(
        (1,),
        description="comma-separated numbers of training processes this host rehearses: 1, and any "
        "number above 1 for jobs of any size above 1 (they are rehearsed with 2 processes under torchrun)",
    )

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.presign_endpoint_url and not (self.store_url or "").startswith("s3://"):
            raise ValueError(
                "presign_endpoint_url is for an S3 store (store_url s3://bucket/prefix): other stores' "
                "blobs are served by the API's own blob route (public_url)"
            )
        if self.presign_endpoint_url and not self.presign_endpoint_url.startswith(("http://", "https://")):
            raise ValueError(f"presign_endpoint_url {self.presign_endpoint_url!r} is not an http(s) URL")
        if self.auth == "off" and not is_loopback(self.host):
            raise ValueError(
                f"auth 'off' while listening on {self.host}: anyone on the network could submit work and read "
                "caches; use auth 'required' (the default off loopback) or listen on 127.0.0.1"
            )
        if self.backend == "neuron" and self.device not in (None, "neuron"):
            raise ValueError(f"backend 'neuron' runs on device 'neuron', not {self.device!r}")
        return self

    @property
    def auth_required(self) -> bool:
        if self.auth == "auto":
            return not is_loopback(self.host)
        return self.auth == "required"

    # The one rule from the data directory to the database and the store.
    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'warmup.db').resolve()}"

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or str((self.data_dir / "blobs").resolve())

    @property
    def locations_given(self) -> bool:
        """Whether the database and store were named (a data dir, or both URLs), by flag or environment,
        rather than left to the ./data default: a worker or gc must not guess where the service is."""
        return "data_dir" in self.model_fields_set or bool(self.database_url and self.store_url)

    def worker_device(self) -> str:
        """The device this worker warms for: given, or the backend's (cuda when torch sees a GPU)."""
        if self.device is not None:
            return self.device
        if self.backend == "neuron":
            return "neuron"
        from warmup.machine import gpu_driver_present

        # No GPU driver: torch would see no GPU either, and importing it takes seconds of a worker's start.
        if not gpu_driver_present():
            return "cpu"
        try:
            import torch
        except ImportError:
            return "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"


# --- the command line, generated from the fields --------------------------------------------------


def _option(name: str) -> Option | None:
    return next((m for m in Settings.model_fields[name].metadata if isinstance(m, Option)), None)


def fields_of(command: Command) -> list[str]:
    return [name for name in Settings.model_fields if (o := _option(name)) and command in o.commands]


def flag_of(name: str) -> str:
    option = _option(name)
    return (option.flag if option and option.flag else None) or "--" + name.replace("_", "-")


def _argument_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """The argparse type and choices of a field's annotation (Optional and Literal unwrapped)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return str, [str(choice) for choice in typing.get_args(annotation)]
    if annotation in (int, float, Path):
        return annotation, None
    return str, None


def add_options(parser: argparse.ArgumentParser, command: Command) -> None:
    """Add the command's settings as options. Every default is None: an option not given leaves the
    setting to its WARMUP_* variable or default, which the help shows."""
    for name in fields_of(command):
        field = Settings.model_fields[name]
        env = f"WARMUP_{name.upper()}"
        default = field.default if field.default is not None else "none"
        if isinstance(default, tuple):
            default = ",".join(str(part) for part in default)
        help_text = f"{field.description} [{env}; default {default}]"
        if field.annotation is bool:
            parser.add_argument(flag_of(name), dest=name, action="store_const", const=True, help=help_text)
            continue
        kind, choices = _argument_type(field.annotation)
        if name == "world_sizes":
            kind = str
        parser.add_argument(flag_of(name), dest=name, type=kind, choices=choices, help=help_text)


def settings_from(ns: argparse.Namespace, command: Command, **overrides: Any) -> Settings:
    """The settings of a parsed command line: given options over WARMUP_* over defaults. Invalid or
    unsafe values are a WarmupError naming the setting (its flag) and the reason."""
    given = {name: getattr(ns, name) for name in fields_of(command) if getattr(ns, name, None) is not None}
    try:
        return Settings(**given, **overrides)
    except ValidationError as error:
        problems = []
        for item in error.errors(include_url=False):
            name = str(item["loc"][0]) if item["loc"] else ""
            where = flag_of(name) if name in Settings.model_fields else "settings"
            problems.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
        raise WarmupError("refusing to start: " + "; ".join(problems)) from None
