"""The toolchain: stable across processes, differences named by field, Neuron facts without hardware."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.fixtures.factories import cpu_toolchain
from warmup.errors import BackendUnavailableError, SpecError, ToolchainMismatchError
from warmup.toolchain.model import (
    Toolchain,
    canonical_neuron_cc_flags,
    compile_env,
    neuron_lnc,
    neuron_target_from_name,
)
from warmup.toolchain.probes import current_toolchain


def _toolchain(**changes: object) -> Toolchain:
    return cpu_toolchain(**{"env": {"TORCHINDUCTOR_MAX_AUTOTUNE": "0"}, **changes})


def test_current_toolchain_on_cpu_records_isa_threads_and_versions():
    import torch

    toolchain = current_toolchain("inductor", "cpu")
    assert toolchain.torch == torch.__version__
    assert len(toolchain.torch_key) == 64
    assert toolchain.cpu_isa and toolchain.num_threads == torch.get_num_threads()
    assert toolchain.trl and toolchain.transformers and toolchain.accelerate
    assert toolchain.neuronx_cc is None and toolchain.compiler_flags is None
    # On every kernel's g++ command line, so in every kernel's key: torch's and Python's folders, named by
    # what they hold (warmup/layout.py), and the compiler.
    assert toolchain.kernel_paths and any(p.startswith("-I<torch@sha256:") for p in toolchain.kernel_paths)
    assert not any(str(Path(torch.__file__).parent) in p for p in toolchain.kernel_paths)
    assert toolchain.cxx and toolchain.source_dirs is None


def test_installs_whose_kernel_folders_hold_other_files_differ_by_the_kernel_paths_that_differ():
    """Two installs of the same wheels name torch's folder alike (its content), wherever they are; a torch
    whose headers differ does not, and the difference names only the entries that differ."""
    same = ("-I<python-include@sha256:p>", "-I<torch@sha256:t>/include", "-L<torch@sha256:t>/lib")
    here, there = _toolchain(kernel_paths=same), _toolchain(kernel_paths=same)
    assert here.key() == there.key()
    other = _toolchain(
        kernel_paths=("-I<python-include@sha256:p>", "-I<torch@sha256:u>/include", "-L<torch@sha256:u>/lib")
    )
    assert here.diff(other) == {
        "kernel_paths": (
            ["-I<torch@sha256:t>/include", "-L<torch@sha256:t>/lib"],
            ["-I<torch@sha256:u>/include", "-L<torch@sha256:u>/lib"],
        )
    }
    reordered = _toolchain(kernel_paths=tuple(reversed(here.kernel_paths or ())))
    assert here.diff(reordered) == {
        "kernel_paths": (list(here.kernel_paths or ()), list(reordered.kernel_paths or ()))
    }
    assert here.diff(_toolchain(kernel_paths=same, cxx="g++ (Debian 14.2.0-19) 14.2.0")) == {
        "cxx": (here.cxx, "g++ (Debian 14.2.0-19) 14.2.0")
    }


def test_cache_dirs_and_policy_variables_stay_out_of_the_toolchain(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    monkeypatch.setenv("TORCH_COMPILE_CACHE_KEY_TAG", "set-by-activate")
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    monkeypatch.setenv("CXX", "/usr/bin/g++-12")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", "/mnt/neff")
    env = compile_env()
    assert env["TORCHINDUCTOR_MAX_AUTOTUNE"] == "1" and env["CXX"] == "/usr/bin/g++-12"
    assert "TORCHINDUCTOR_CACHE_DIR" not in env
    assert "TORCH_COMPILE_CACHE_KEY_TAG" not in env
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" not in env


def test_accelerate_launchs_dynamo_defaults_are_the_same_as_unset():
    """`trl sft --config` runs under `accelerate launch`, which exports its dynamo settings at their defaults
    to the training process; a worker has none. Only a value that changes what accelerate does counts."""
    launched = {
        "ACCELERATE_DYNAMO_BACKEND": "NO",
        "ACCELERATE_DYNAMO_MODE": "default",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "false",
    }
    assert compile_env(launched) == compile_env({}) == {}
    asked = {**launched, "ACCELERATE_DYNAMO_MODE": "max-autotune", "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True"}
    assert compile_env(asked) == {
        "ACCELERATE_DYNAMO_MODE": "max-autotune",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True",
    }


def test_key_is_stable_and_changes_with_any_field():
    assert _toolchain().key() == _toolchain().key()
    assert _toolchain().key() != _toolchain(num_threads=4).key()
    assert _toolchain().key() != _toolchain(env={"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}).key()
    # each field of the model, changed alone (a value of its own type), changes the key
    base = _toolchain()
    other = {
        "backend": "neuron",
        "device": "cuda",
        "num_threads": 99,
        "neuron_lnc": 2,
        "cpu_target": ("-march=other",),
        "kernel_paths": ("-I/other",),
        "source_dirs": ("/other",),
        "env": {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"},
    }
    for field in Toolchain.model_fields:
        changed = base.model_copy(update={field: other.get(field, f"{getattr(base, field)}-other")})
        assert changed.key() != base.key(), field


def test_diff_names_each_differing_field_with_both_values():
    ours = _toolchain()
    theirs = _toolchain(torch="2.14.1", cpu_isa="avx2", env={"CXX": "clang++"})
    assert ours.diff(theirs) == {
        "torch": ("2.13.0+cpu", "2.14.1"),
        "cpu_isa": ("avx512", "avx2"),
        "env.CXX": (None, "clang++"),
        "env.TORCHINDUCTOR_MAX_AUTOTUNE": ("0", None),
    }
    assert ours.diff(_toolchain()) == {}


def test_require_same_raises_a_mismatch_error_naming_the_fields():
    with pytest.raises(ToolchainMismatchError) as raised:
        _toolchain().require_same(_toolchain(torch="2.14.1"))
    assert "torch" in raised.value.differences
    assert "2.14.1" in str(raised.value)
    _toolchain().require_same(_toolchain())


def test_cuda_toolchain_without_a_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        assert current_toolchain("inductor", "cuda").cuda is not None
        return
    with pytest.raises(BackendUnavailableError, match="no GPU"):
        current_toolchain("inductor", "cuda")


def test_neuron_toolchain_without_the_sdk_is_a_clear_error():
    with pytest.raises(BackendUnavailableError, match="torch-neuronx"):
        current_toolchain("neuron", "neuron")


def test_backend_and_device_must_fit():
    with pytest.raises(SpecError):
        current_toolchain("neuron", "cpu")
    with pytest.raises(SpecError):
        current_toolchain("tpu", "cpu")


@pytest.mark.parametrize(
    ("flags", "canonical"),
    [
        ("--model-type transformer --auto-cast=none", "--auto-cast=none --model-type=transformer"),
        ("--auto-cast none   --model-type=transformer", "--auto-cast=none --model-type=transformer"),
        ("-O1 --enable-fast-loading", "--enable-fast-loading -O1"),
        ("--cache_dir=/var/tmp/x --verbose 35 -O2", "-O2"),
        ("--lnc 2 --distribution-strategy llm-training", "--distribution-strategy=llm-training --lnc=2"),
        ("--offset -1 -O1", "--offset=-1 -O1"),
        ("", ""),
        (None, ""),
    ],
)
def test_neuron_cc_flags_have_one_canonical_form(flags, canonical):
    assert canonical_neuron_cc_flags(flags) == canonical


def test_unparseable_neuron_cc_flags_are_a_spec_error():
    with pytest.raises(SpecError, match="NEURON_CC_FLAGS"):
        canonical_neuron_cc_flags('--x "unclosed')


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("trn2.48xlarge", "trn2"),
        ("trn1n.32xlarge", "trn1"),
        ("Trainium2", "trn2"),
        ("trn3", "trn3"),
        ("m5.large", None),
    ],
)
def test_trainium_generation_from_instance_or_device_name(name, target):
    assert neuron_target_from_name(name) == target


def test_lnc_defaults_per_generation_and_validates_the_variable():
    assert neuron_lnc("trn2", {}) == 2
    assert neuron_lnc("trn1", {}) == 1
    assert neuron_lnc("trn2", {"NEURON_LOGICAL_NC_CONFIG": "1"}) == 1
    with pytest.raises(SpecError, match="only 1 and 2"):
        neuron_lnc("trn2", {"NEURON_LOGICAL_NC_CONFIG": "4"})
    with pytest.raises(SpecError, match="trn1"):
        neuron_lnc("trn1", {"NEURON_LOGICAL_NC_CONFIG": "2"})


def test_toolchain_round_trips_through_json():
    toolchain = _toolchain(device="neuron", backend="neuron", device_kind="trn2", neuron_lnc=2)
    again = Toolchain.model_validate(json.loads(toolchain.canonical_json()))
    assert again == toolchain and again.key() == toolchain.key()


def test_a_pods_toolchain_is_remembered_until_a_fact_changes(tmp_path, monkeypatch):
    from warmup.toolchain.memo import TOOLCHAIN_MEMO, remembered_toolchain
    from warmup.toolchain.probes import current_toolchain

    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE", raising=False)
    first = remembered_toolchain("inductor", "cpu", directory=tmp_path)
    assert first == current_toolchain("inductor", "cpu")
    memo = tmp_path / TOOLCHAIN_MEMO
    assert memo.exists()
    # A remembered toolchain is returned as written (proof: tamper with the memo's toolchain only).
    data = json.loads(memo.read_text())
    data["toolchain"]["python"] = "remembered"
    memo.write_text(json.dumps(data))
    assert remembered_toolchain("inductor", "cpu", directory=tmp_path).python == "remembered"
    # A compile-relevant change makes it compute again.
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    changed = remembered_toolchain("inductor", "cpu", directory=tmp_path)
    assert changed.python != "remembered" and changed.env.get("TORCHINDUCTOR_MAX_AUTOTUNE") == "1"
    # So does a different number of training processes, and a corrupt memo is ignored.
    assert remembered_toolchain("inductor", "cpu", world_size=2, directory=tmp_path).python != "remembered"
    memo.write_text("{not json")
    assert remembered_toolchain("inductor", "cpu", directory=tmp_path) == changed


# --- the image's memo: a fresh pod's toolchain without importing torch ------------------------------

AMX_TABLE = [
    ("avx512 avx512_vnni amx_tile", ["avx512f", "avx512bw", "avx512_vnni", "amx_tile"]),
    ("avx512 avx512_vnni", ["avx512f", "avx512bw", "avx512_vnni"]),
    ("avx512", ["avx512f", "avx512bw"]),
    ("avx2", ["avx2", "fma", "f16c"]),
]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "amx_tile"},
            "avx512 avx512_vnni amx_tile",
        ),
        ({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni"}, "avx512 avx512_vnni"),
        ({"avx2", "fma", "f16c", "avx512f", "avx512bw"}, "avx512"),
        ({"avx2", "fma", "f16c"}, "avx2"),
        ({"avx", "sse4_2"}, None),  # no candidate: computed, never guessed
    ],
)
def test_the_cpu_isa_is_predicted_from_the_kernels_flags_in_inductors_order(flags, expected):
    from warmup.machine import predicted_cpu_isa

    assert predicted_cpu_isa(AMX_TABLE, frozenset(flags)) == expected
    assert predicted_cpu_isa([], frozenset(flags)) is None


def test_inductors_compiler_flags_become_the_kernels_names():
    from warmup.machine import kernel_flags_of

    assert kernel_flags_of("-mavx512f -mavx512vnni -mamx-tile -mfma") == [
        "avx512f",
        "avx512_vnni",
        "amx_tile",
        "fma",
    ]
    assert kernel_flags_of("-march=armv8-a+sve -msve-vector-bits=256") == []


def test_a_workers_toolchain_comes_from_the_images_memo_only_when_exact(tmp_path, monkeypatch):
    """A worker labels its uploads with its toolchain: the memo's exact entry spares it torch's import, a
    prediction for a machine the memo has not seen is not enough (computed, then remembered as exact)."""
    import warmup.toolchain.memo as toolchains
    from warmup.toolchain.memo import host_toolchain, remember_in_image

    monkeypatch.setenv("WARMUP_TOOLCHAIN_MEMO", str(tmp_path / "toolchain.json"))
    exact = current_toolchain("inductor", "cpu")
    remember_in_image(exact)
    computed: list[str] = []
    monkeypatch.setattr(
        toolchains,
        "current_toolchain",
        lambda backend, device, world_size=1: computed.append(device) or exact,
    )
    assert host_toolchain("inductor", "cpu") == exact and computed == []

    data = json.loads((tmp_path / "toolchain.json").read_text())
    data["exact"] = {}  # the memo knows this install, not this machine: a pod would predict
    (tmp_path / "toolchain.json").write_text(json.dumps(data))
    assert host_toolchain("inductor", "cpu") == exact and computed == ["cpu"]
    assert host_toolchain("inductor", "cpu") == exact and computed == ["cpu"]  # remembered as exact now


def test_without_a_gpu_driver_a_worker_picks_cpu_without_asking_torch(monkeypatch):
    """torch is asked only where a GPU driver is loaded (importing it takes seconds of a worker's start)."""
    from types import SimpleNamespace

    from warmup import machine
    from warmup.settings import Settings

    asked: list[bool] = []
    gpu_torch = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: asked.append(True) or True))
    monkeypatch.setitem(sys.modules, "torch", gpu_torch)
    monkeypatch.setattr(machine, "gpu_driver_present", lambda: False)
    assert Settings(backend="inductor").worker_device() == "cpu" and asked == []
    monkeypatch.setattr(machine, "gpu_driver_present", lambda: True)
    assert Settings(backend="inductor").worker_device() == "cuda" and asked == [True]
    assert Settings(backend="inductor", device="cpu").worker_device() == "cpu"  # given: taken as it is


# --- the CPU target: what -march=native builds for --------------------------------------------------------

# What `g++ -march=native -### -fsyntax-only -x c++ /dev/null` prints for the compiler proper, gcc 12 on two CPUs of the
# same Inductor ISA (`avx512 avx512_vnni`): an AMD EPYC (this line as printed on the project's machine, its
# extensions turned off shortened), and a Cascade Lake in the same form (the extensions gcc gives
# `-march=cascadelake`, its L1 data cache and tuning).
GCC_ZEN = (
    " /usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -E -quiet -imultiarch x86_64-linux-gnu -D_GNU_SOURCE /dev/null"
    ' "-march=znver3" -mmmx -mpopcnt -msse -msse2 -msse3 -mssse3 -msse4.1 -msse4.2 -mavx -mavx2 -msse4a'
    " -mno-fma4 -mfma -mavx512f -mbmi -mbmi2 -maes -mpclmul -mavx512vl -mavx512bw -mavx512dq -mavx512cd"
    " -mavx512vbmi -mavx512ifma -mavx512vpopcntdq -mavx512vbmi2 -mgfni -mvpclmulqdq -mavx512vnni"
    " -mavx512bitalg -mavx512bf16 -mavx512vp2intersect -madx -mabm -mclflushopt -mclwb -mclzero -mcx16"
    " -mf16c -mfsgsbase -mfxsr -msahf -mlzcnt -mmovbe -mno-mwaitx -mprfchw -mrdpid -mrdrnd -mrdseed -msha"
    " -mshstk -mvaes -mxsave -mxsavec -mxsaveopt -mxsaves -mno-amx-tile -mavxvnni -mno-avx512fp16"
    ' --param "l1-cache-size=48" --param "l1-cache-line-size=64" --param "l2-cache-size=1024"'
    ' "-mtune=znver3" -fasynchronous-unwind-tables -dumpbase null'
)
GCC_CASCADE_LAKE = (
    " /usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -E -quiet -imultiarch x86_64-linux-gnu -D_GNU_SOURCE /dev/null"
    ' "-march=cascadelake" -mmmx -mpopcnt -msse -msse2 -msse3 -mssse3 -msse4.1 -msse4.2 -mavx -mavx2'
    " -mno-sse4a -mno-fma4 -mfma -mavx512f -mbmi -mbmi2 -maes -mpclmul -mavx512vl -mavx512bw -mavx512dq"
    " -mavx512cd -mno-avx512vbmi -mno-avx512ifma -mno-avx512vpopcntdq -mno-avx512vbmi2 -mno-gfni"
    " -mno-vpclmulqdq -mavx512vnni -mno-avx512bitalg -mno-avx512bf16 -mno-avx512vp2intersect -madx -mabm"
    " -mclflushopt -mclwb -mno-clzero -mcx16 -mf16c -mfsgsbase -mfxsr -msahf -mlzcnt -mmovbe -mno-mwaitx"
    " -mprfchw -mno-rdpid -mrdrnd -mrdseed -mno-sha -mno-shstk -mno-vaes -mxsave -mxsavec -mxsaveopt -mxsaves"
    " -mno-amx-tile -mno-avxvnni -mno-avx512fp16"
    ' --param "l1-cache-size=32" --param "l1-cache-line-size=64" --param "l2-cache-size=1024"'
    ' "-mtune=cascadelake" -fasynchronous-unwind-tables -dumpbase null'
)
DRIVER_PREAMBLE = "Using built-in specs.\nCOLLECT_GCC=g++\nTarget: x86_64-linux-gnu\n"


def test_the_cpu_target_is_what_the_compiler_proper_is_told_sorted_and_without_what_is_off():
    from warmup.machine import target_of

    zen = target_of(DRIVER_PREAMBLE + GCC_ZEN + "\nCOMPILER_PATH=/usr/lib/gcc/\n")
    assert zen is not None and list(zen) == sorted(set(zen))
    assert "-march=znver3" in zen and "-mtune=znver3" in zen and "-mavx512vp2intersect" in zen
    assert {"--param=l1-cache-size=48", "--param=l1-cache-line-size=64", "--param=l2-cache-size=1024"} <= set(
        zen
    )
    assert not any(option.startswith("-mno-") for option in zen)  # implied: same compiler, these enabled
    # Stable: the same options in another order, repeated, or `--param=` spelled in one word are one target.
    shuffled = GCC_ZEN.replace('"-mtune=znver3"', '"-mtune=znver3" -mavx2').replace(
        '--param "l1-cache-size=48"', "--param=l1-cache-size=48"
    )
    assert target_of(shuffled) == zen
    assert target_of("g++: error: unrecognized command-line option '-march=native'\n") is None
    assert target_of("") is None


def test_clangs_target_options_are_spelled_as_gccs():
    from warmup.machine import target_of

    clang = (
        ' "/usr/lib/llvm-16/bin/clang" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-fsyntax-only" "-target-cpu" "znver3"'
        ' "-target-feature" "+avx2" "-target-feature" "-avx512fp16" "-target-feature" "+avx512f"'
        ' "-tune-cpu" "znver3" "-x" "c++" "/dev/null"'
    )
    assert target_of("clang version 16.0.6\n" + clang) == (
        "-march=znver3",
        "-mavx2",
        "-mavx512f",
        "-mtune=znver3",
    )


def test_two_cpus_of_the_same_isa_differ_by_cpu_target_naming_what_each_has_alone():
    from warmup.machine import target_of

    zen, cascade_lake = target_of(GCC_ZEN), target_of(GCC_CASCADE_LAKE)
    here, there = _toolchain(cpu_target=zen), _toolchain(cpu_target=cascade_lake)
    assert here.cpu_isa == there.cpu_isa and here.key() != there.key()
    only_zen, only_cascade_lake = here.diff(there)["cpu_target"]
    assert set(here.diff(there)) == {"cpu_target"}
    assert {
        "-march=znver3",
        "-mtune=znver3",
        "-mavx512vbmi",
        "-mavx512bf16",
        "--param=l1-cache-size=48",
    } <= set(only_zen)
    assert set(only_cascade_lake) == {"-march=cascadelake", "-mtune=cascadelake", "--param=l1-cache-size=32"}
    with pytest.raises(ToolchainMismatchError, match="cpu_target"):
        there.require_same(here)
    assert _toolchain(cpu_target=target_of(GCC_ZEN)).key() == here.key()


def test_this_machines_toolchain_records_what_its_kernels_are_built_for():
    from warmup import layout, machine

    toolchain = current_toolchain("inductor", "cpu")
    assert layout.command_line_native_flags() == ("-march=native",)  # torch 2.13 on x86 and most ARM
    assert toolchain.cpu_target == machine.native_target(("-march=native",))
    assert toolchain.cpu_target and any(option.startswith("-march=") for option in toolchain.cpu_target)
    assert "-march=native" not in toolchain.cpu_target


def test_a_pod_resolves_its_cpu_target_with_the_flags_the_images_memo_recorded(tmp_path, monkeypatch):
    """The image's memo knows this install, not this machine: the pod's CPU target is what its compiler
    makes of the native flags the memo recorded from Inductor's command line; none recorded (a target named
    with TORCHINDUCTOR_CPP_MARCH), none predicted; a compiler that cannot say leaves the toolchain to be
    computed."""
    from warmup import machine
    from warmup.toolchain.memo import BUILD_FIELDS, IMAGE_MEMO_FORMAT, _facts_key, image_memo_toolchain

    memo = tmp_path / "toolchain.json"
    monkeypatch.setenv("WARMUP_TOOLCHAIN_MEMO", str(memo))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(
        machine, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw"})
    )
    targets = {("-march=native",): machine.target_of(GCC_CASCADE_LAKE)}
    monkeypatch.setattr(machine, "native_target", lambda flags=("-march=native",): targets.get(tuple(flags)))
    build = {"install": "the image's"}
    software = {
        name: value for name, value in _toolchain().model_dump(mode="json").items() if name in BUILD_FIELDS
    }

    def predicted(native_flags: list[str]) -> Toolchain | None:
        entry = {"facts": software, "isa_table": AMX_TABLE, "native_flags": native_flags}
        memo.write_text(
            json.dumps({"format": IMAGE_MEMO_FORMAT, "builds": {_facts_key(build): entry}, "exact": {}})
        )
        found = image_memo_toolchain(build, {"machine": "unseen"}, 1)
        assert found is None or found[1] == "predicted"
        return found[0] if found else None

    pod = predicted(["-march=native"])
    assert pod is not None and pod.cpu_isa == "avx512" and pod.cpu_target == targets[("-march=native",)]
    assert pod.diff(_toolchain(num_threads=2, cpu_target=machine.target_of(GCC_CASCADE_LAKE))) == {}
    named = predicted([])
    assert named is not None and named.cpu_target is None
    assert predicted(["-mcpu=native"]) is None  # the compiler cannot say: computed, never guessed
