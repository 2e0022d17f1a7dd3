"""What a sharded launch puts in the signature, how many processes rehearse it, and what is refused where
(warmup/planner/sharding.py; the measurements behind each rule are in docs/multi-node.md)."""

from __future__ import annotations

import types

import pytest

from warmup.errors import UnsupportedLaunchError
from warmup.job.spec import Spec
from warmup.job.trl_launch import Launch
from warmup.planner.sharding import check_launch, notes, refusal, rehearsal_processes, sharding_label
from warmup.signature import Signature

ZERO3 = Launch(processes=8, distributed_type="DEEPSPEED", zero_stage=3, source="accelerate_config zero3")
ZERO2_OFFLOAD = Launch(processes=8, distributed_type="DEEPSPEED", zero_stage=2, offload_optimizer="cpu")
FSDP2 = Launch(processes=8, distributed_type="FSDP", fsdp_version=2, source="accelerate_config fsdp2")
FSDP1 = Launch(processes=8, distributed_type="FSDP", fsdp_version=1, source="accelerate_config fsdp1")
DDP = Launch(processes=8, distributed_type="MULTI_GPU")
TARGETS = {
    "cpu": {"backend": "inductor", "device": "cpu"},
    "cuda": {"backend": "inductor", "device": "cuda"},
    "neuron": {"backend": "neuron", "device": "neuron"},
}
SFT = types.SimpleNamespace(label_smoothing_factor=0.0)


def spec(target: str, world: int = 8) -> Spec:
    return Spec.model_validate(
        {"trainer": "sft", "model": "m", "target": {**TARGETS[target], "world_size": world}}
    )


def test_the_label_names_the_wrapper_where_it_changes_the_graphs():
    assert sharding_label(DDP) is None
    assert sharding_label(ZERO3) == "zero3"
    assert sharding_label(ZERO2_OFFLOAD) == "zero2"  # offload changes no graph (measured)
    assert sharding_label(FSDP2) == "fsdp2"
    assert sharding_label(
        Launch(distributed_type="FSDP", fsdp_version=2, fsdp={"activation_checkpointing": True})
    ) == ("fsdp2:ac")


def test_a_signature_without_sharding_keeps_the_key_it_had():
    fields = {"phase": "train", "batch": 2, "seq_len": 32, "trainer": "sft", "model": "m", "dtype": "float32"}
    plain = Signature(compile="inductor", **fields)
    assert '"sharding"' not in plain.model_dump_json(exclude_none=True)
    assert plain.key() == Signature(compile="inductor", sharding=None, **fields).key()
    assert plain.key() != Signature(compile="inductor", sharding="zero3", **fields).key()


@pytest.mark.parametrize(
    ("launch", "target", "use_cpu", "refused_for"),
    [
        (ZERO3, "neuron", False, "DeepSpeed has no Neuron accelerator"),
        (FSDP1, "neuron", False, "TorchNeuron documents FSDP2"),
        (FSDP1, "cpu", True, "does not run on CPU"),
        (ZERO3, "cpu", False, "without use_cpu: true"),
        (FSDP2, "cpu", False, "without use_cpu: true"),
        (ZERO3, "cuda", False, None),
        (FSDP1, "cuda", False, None),
        (FSDP2, "neuron", False, None),
        (ZERO3, "cpu", True, None),
        (FSDP2, "cpu", True, None),
        (DDP, "neuron", False, None),
    ],
)
def test_what_cannot_run_faithfully_is_refused_with_the_mode_that_works(launch, target, use_cpu, refused_for):
    reason = refusal(spec(target), launch, use_cpu)
    if refused_for is None:
        assert reason is None
        check_launch(spec(target), launch, use_cpu)
        return
    assert refused_for in reason and (
        "fsdp2" in reason or "fsdp_version: 2" in reason or "use_cpu: true" in reason
    )
    with pytest.raises(UnsupportedLaunchError) as raised:
        check_launch(spec(target), launch, use_cpu)
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(
    ("launch", "target", "world", "expected"),
    [
        (DDP, "cpu", 8, None),  # the DDP rule (warmup/planner/topology.py)
        (ZERO3, "cpu", 8, 2),
        (ZERO3, "cpu", 1, 1),
        (FSDP2, "cpu", 64, 2),
        (FSDP2, "cuda", 16, 16),  # one process per GPU of the node: accelerate puts local rank k on cuda:k
        (FSDP2, "neuron", 4, 4),  # TorchNeuron compiles each rank's eager shard ops: the job's world size
    ],
)
def test_a_sharded_job_is_rehearsed_with_the_fewest_faithful_processes(launch, target, world, expected):
    assert rehearsal_processes(spec(target, world), launch) == expected


def test_gpu_jobs_are_rehearsed_with_the_processes_of_one_node():
    launch = Launch(processes=32, machines=4, distributed_type="DEEPSPEED", zero_stage=3)
    assert rehearsal_processes(spec("cuda", 32), launch) == 8


def test_the_notes_say_what_was_measured_and_warn_where_counters_will_show_work():
    said, warned = notes(spec("cpu"), ZERO3, 2, SFT)
    assert any("one entry per signature serves every rank" in note for note in said)
    assert any("AOTAutograd" in warning for warning in warned)
    assert any("fused LM head" in warning for warning in warned)  # TRL's SFT loss under ZeRO-3 on CPU
    said, warned = notes(spec("cpu"), FSDP2, 2, SFT)
    assert any("warmup.rehearsal.cpu_sharding" in warning for warning in warned)
    said, _ = notes(spec("neuron"), FSDP2, 8, SFT)
    assert any("not verified on Trainium" in note for note in said)
    assert notes(spec("cpu"), DDP, 2, SFT) == ([], [])
