"""What several commands share: the SPEC argument and its target overrides."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warmup.spec import Spec


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="spec file (YAML/JSON), or the YAML of `trl <trainer> --config`")
    parser.add_argument("--trainer", help="trainer kind, for a TRL CLI config that does not say it")
    parser.add_argument(
        "--backend", choices=["neuron", "inductor"], help="override the spec's target backend"
    )
    parser.add_argument(
        "--device", choices=["neuron", "cuda", "cpu"], help="override the spec's target device"
    )
    parser.add_argument("--world-size", type=int, help="override the spec's number of training processes")


def target_overrides(ns: argparse.Namespace) -> dict[str, Any] | None:
    """--backend, --device and --world-size, as a spec's `target` fields (None when none is given)."""
    target = {
        key: value
        for key, value in (("backend", ns.backend), ("device", ns.device), ("world_size", ns.world_size))
        if value is not None
    }
    return target or None


def load_spec_from_args(ns: argparse.Namespace) -> Spec:
    from warmup.spec import load_spec

    return load_spec(ns.spec, trainer=ns.trainer, target=target_overrides(ns))
