"""A worker that cannot see the model a spec names says which machine looked, and where (the spec was read, and
its paths made absolute, on another machine)."""

from __future__ import annotations

import shutil
import socket

import pytest

from tests.support.jobs import signature
from warmup.errors import ModelConfigError
from warmup.job.spec import parse_spec
from warmup.rehearsal.runner import rehearse


def test_a_model_path_this_machine_lacks_is_refused_naming_the_machine(tiny_model_dir, tmp_path):
    model = tmp_path / "on-the-client" / "tiny-qwen"
    shutil.copytree(tiny_model_dir, model)
    spec = parse_spec(
        {
            "trainer": "sft",
            "model": str(model),
            "args": {
                "torch_compile": True,
                "use_cpu": True,
                "per_device_train_batch_size": 2,
                "max_length": 64,
            },
            "target": {"backend": "inductor", "device": "cpu"},
        }
    )
    wanted = signature("sft", model, "train", 2, 64)
    shutil.rmtree(model)  # this machine is not the one that read the config
    with pytest.raises(ModelConfigError) as error:
        rehearse(spec, [wanted], tmp_path / "cache")
    assert f"model directory {model} does not exist (looked on {socket.gethostname()} at {model})" in str(
        error.value
    )
