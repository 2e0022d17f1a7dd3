"""The Launch facts a trl config's launcher and sharding fields come to (warmup/trl_config.py)."""

from __future__ import annotations

import dataclasses

from warmup.trl_config import Launch


def test_launch_is_frozen_and_hashable_with_its_dicts_left_out_of_the_hash():
    launch = Launch(processes=8, distributed_type="FSDP", fsdp_version=2, fsdp={"offload_params": True})
    assert hash(launch) == hash(dataclasses.replace(launch, fsdp={"offload_params": False}))
    assert launch != dataclasses.replace(launch, fsdp={"offload_params": False})
    assert {launch: 1}[launch] == 1


def test_the_mode_is_named_precisely():
    zero3 = Launch(
        processes=8,
        distributed_type="DEEPSPEED",
        zero_stage=3,
        offload_param="cpu",
        source="examples/accelerate_configs/deepspeed_zero3.yaml",
    )
    assert zero3.sharded
    assert zero3.describe() == (
        "DeepSpeed ZeRO-3 with CPU offload of parameters, 8 processes from "
        "examples/accelerate_configs/deepspeed_zero3.yaml"
    )
    fsdp = Launch(processes=16, machines=2, distributed_type="FSDP", fsdp_version=2, source="fsdp2.yaml")
    assert fsdp.describe() == "FSDP2, 16 processes on 2 machines from fsdp2.yaml"
    assert not Launch(processes=8, distributed_type="MULTI_GPU").sharded
