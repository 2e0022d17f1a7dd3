"""A Hub model id: its config comes from the Hugging Face cache when it is there, and a machine that cannot
reach the Hub is told so at once, not after huggingface_hub's half-minute of retries."""

from __future__ import annotations

import json
import socket

import huggingface_hub
import huggingface_hub.constants
import pytest

from warmup.errors import ModelConfigError
from warmup.job.model_facts import read_model_facts

REPO = "some-org/some-model"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    read_model_facts.cache_clear()  # a process reads each model's facts once
    yield tmp_path / "hub"
    read_model_facts.cache_clear()


def test_a_config_in_the_hugging_face_cache_is_read_without_the_network(hf_cache, monkeypatch):
    commit = "0" * 40
    repo = hf_cache / "models--some-org--some-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "hidden_size": 8})
    )
    monkeypatch.setattr(socket, "getaddrinfo", _no_network)

    facts = read_model_facts(REPO)

    assert facts.config == {"model_type": "qwen3", "hidden_size": 8}


def test_a_hub_that_cannot_be_resolved_is_an_error_at_once(hf_cache, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _no_network)
    calls = []
    download = huggingface_hub.hf_hub_download

    def recorded(*args, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        return download(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", recorded)
    with pytest.raises(ModelConfigError) as refused:
        read_model_facts(REPO)
    assert calls == [True]  # only the cache was asked: no download, so none of its retries with back-off
    message = str(refused.value)
    assert "huggingface.co cannot be resolved from this machine" in message
    assert "the Hugging Face cache holds no copy" in message and "pass a local model directory" in message


def test_offline_mode_is_named(hf_cache, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelConfigError, match="HF_HUB_OFFLINE is set"):
        read_model_facts(REPO)


def _no_network(*args, **kwargs):
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
