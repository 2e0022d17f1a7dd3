"""What the planner needs from a model: its config, read as JSON (no weights, no torch).

The config hash names the model in signatures: two models whose configs differ only in cosmetic
keys (their path, the transformers version that wrote them) compile the same graphs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmup.errors import ModelConfigError

# Keys of config.json that never change a compiled graph.
COSMETIC_CONFIG_KEYS = frozenset(
    {"_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset"}
)


@dataclass(frozen=True)
class ModelFacts:
    source: str
    config: dict[str, Any]
    config_hash: str

    @property
    def architecture(self) -> str | None:
        architectures = self.config.get("architectures") or []
        return architectures[0] if architectures else None

    @property
    def dtype(self) -> str | None:
        """The dtype the checkpoint declares ("auto" loads it)."""
        return self.config.get("dtype") or self.config.get("torch_dtype")

    @property
    def sliding_window(self) -> int | None:
        return self.config.get("sliding_window") if self.config.get("use_sliding_window", True) else None


def config_hash(config: dict[str, Any]) -> str:
    relevant = {k: v for k, v in config.items() if k not in COSMETIC_CONFIG_KEYS}
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def read_model_facts(source: str) -> ModelFacts:
    """Read `config.json` from a local directory, or from the Hugging Face Hub for a hub id."""
    try:
        path = Path(source).expanduser()
        is_dir = path.is_dir()
    except (OSError, RuntimeError) as error:  # a name too long for the filesystem, an unknown ~user
        raise ModelConfigError(f"model {source[:200]!r} is not a readable directory: {error}") from None
    if is_dir:
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelConfigError(f"model directory {source} has no config.json{_where(path)}")
    elif source.startswith((".", "/", "~")):
        raise ModelConfigError(f"model directory {source} does not exist{_where(path)}")
    else:
        config_path = _download_config(source)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelConfigError(f"cannot read {config_path}: {error}") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{config_path} is not a JSON object")
    return ModelFacts(source=source, config=config, config_hash=config_hash(config))


def _where(path: Path) -> str:
    """Which machine looked, and where: a spec read on one machine is planned and warmed on others."""
    where = f" (looked on {socket.gethostname()} at {os.path.abspath(path)}"
    if not path.is_absolute():
        where += (
            "; a relative path is read from the working directory of whoever reads it: run the warmup command "
            "where the path exists, and it sends the path as an absolute one"
        )
    return where + ")"


def _download_config(repo_id: str) -> Path:
    """config.json of a Hub model: the Hugging Face cache's copy when it has one (no network), else
    downloaded. A machine that cannot resolve the Hub's host is told so at once: huggingface_hub would
    retry for half a minute first, printing each retry."""
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError:
        raise ModelConfigError(
            f"{repo_id!r} is not a local directory, and huggingface_hub is not installed to fetch it"
        ) from None
    with contextlib.suppress(Exception):
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=True))
    unreachable = ""
    if constants.HF_HUB_OFFLINE:
        unreachable = "HF_HUB_OFFLINE is set"
    else:
        host = urllib.parse.urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
        try:
            socket.getaddrinfo(host, 443)
        except OSError as error:
            unreachable = f"{host} cannot be resolved from this machine: {error}"
    if unreachable:
        raise _not_fetched(repo_id, f"{unreachable}, and the Hugging Face cache holds no copy of it")
    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except Exception as error:  # unknown repo, gated, a network that fails midway: all mean the same here
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise _not_fetched(repo_id, f"{type(error).__name__}: {first_line}") from None


def _not_fetched(repo_id: str, cause: str) -> ModelConfigError:
    return ModelConfigError(
        f"cannot fetch config.json of {repo_id!r} from the Hugging Face Hub ({cause}); "
        "pass a local model directory instead"
    )
