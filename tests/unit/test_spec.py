"""The spec: our form, TRL's CLI form, and one clear error per bad field."""

from __future__ import annotations

import pytest

from warmup.errors import SpecError, UnknownTrainerError
from warmup.job.spec import load_spec
from warmup.job.trl_args import resolve_trainer_args


def spec_dict(**overrides):
    base = {
        "trainer": "sft",
        "model": "/models/tiny",
        "args": {},
        "target": {"backend": "neuron", "device": "neuron"},
    }
    base.update(overrides)
    return base


def problems(error: SpecError) -> dict[str, str]:
    return {p.loc: p.msg for p in error.problems}


def test_native_yaml_round_trip(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "trainer: grpo\nmodel: Qwen/Qwen3-0.6B\nargs:\n  per_device_train_batch_size: 4\n"
        "data:\n  max_prompt_tokens: 300\ntarget:\n  backend: neuron\n  device: neuron\n  world_size: 4\n"
    )
    spec = load_spec(path)
    assert spec.trainer == "grpo"
    assert spec.target.world_size == 4
    assert spec.data.max_prompt_tokens == 300
    assert load_spec(spec.model_dump()).key() == spec.key()


def test_same_spec_same_key_whatever_the_key_order():
    a = load_spec(spec_dict(args={"max_length": 512, "per_device_train_batch_size": 2}))
    b = load_spec(spec_dict(args={"per_device_train_batch_size": 2, "max_length": 512}))
    assert a.key() == b.key()
    assert a.key() != load_spec(spec_dict(args={"max_length": 256})).key()


def test_a_json_spec_file_and_its_yaml_twin_have_one_key(tmp_path):
    """Spec files are read by one parser: YAML reads `1e-5` as text where JSON reads a number, so a
    faster JSON path for .json files would give a job's .json and .yaml two keys (and two caches)."""
    args = '"max_length": 64, "learning_rate": 1e-5'
    target = '"target": {"backend": "inductor", "device": "cpu"}'
    as_json = tmp_path / "job.json"
    as_json.write_text(f'{{"trainer": "sft", "model": "m", "args": {{{args}}}, {target}}}')
    as_yaml = tmp_path / "job.yaml"
    as_yaml.write_text(
        "trainer: sft\nmodel: m\nargs:\n  max_length: 64\n  learning_rate: 1e-5\n"
        "target:\n  backend: inductor\n  device: cpu\n"
    )
    assert load_spec(as_json).key() == load_spec(as_yaml).key()


def test_unknown_trainer_suggests_the_close_one():
    with pytest.raises(UnknownTrainerError) as error:
        load_spec(spec_dict(trainer="stf"))
    assert "did you mean 'sft'" in str(error.value)
    assert error.value.problems[0].loc == "trainer"


def test_unknown_top_level_field_suggests_spelling():
    with pytest.raises(SpecError) as error:
        load_spec({**spec_dict(), "tagret": {}})
    assert problems(error.value) == {"tagret": "unknown field; did you mean 'target'?"}


def test_target_backend_must_match_device():
    with pytest.raises(SpecError) as error:
        load_spec(spec_dict(target={"backend": "neuron", "device": "cuda"}))
    assert "target" in problems(error.value)


def test_data_facts_ranges_are_checked():
    with pytest.raises(SpecError) as error:
        load_spec(spec_dict(data={"min_tokens": 900, "max_tokens": 100}))
    assert "min_tokens (900) is larger than max_tokens (100)" in str(error.value)


def test_distillation_needs_a_teacher():
    with pytest.raises(SpecError, match="teacher_model"):
        load_spec(spec_dict(trainer="distillation"))


def test_trl_cli_config_is_imported(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen3-0.6B\ndtype: bfloat16\nattn_implementation: eager\n"
        "dataset_name: trl-lib/Capybara\nuse_peft: true\nlora_r: 16\n"
        "per_device_train_batch_size: 2\nmax_length: 2048\noutput_dir: out\nlogging_steps: 5\n"
    )
    spec = load_spec(path, trainer="sft", target={"backend": "neuron", "device": "neuron"})
    assert spec.model == "Qwen/Qwen3-0.6B"
    assert spec.peft == {"lora_r": 16}
    assert spec.args["model_init_kwargs"] == {"dtype": "bfloat16", "attn_implementation": "eager"}
    assert "dataset_name" not in spec.args
    assert spec.args["max_length"] == 2048


def test_trl_cli_config_without_trainer_is_an_error(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: m\nmax_length: 10\n")
    with pytest.raises(SpecError, match="trainer"):
        load_spec(path)


def test_missing_file_and_bad_yaml_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec("trainer: [sft\n model: x")


# --- args against TRL's real config classes ----------------------------------------------------


def test_unknown_arg_names_the_field_and_suggests():
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(load_spec(spec_dict(args={"max_lenght": 512})))
    assert problems(error.value) == {
        "args.max_lenght": "unknown field (`trl sft` refuses it: accelerate launch: unrecognized arguments: "
        "--max_lenght); not a field of any dataclass `trl sft` reads; did you mean `max_length`?"
    }


def test_wrong_type_names_the_field():
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(load_spec(spec_dict(args={"per_device_train_batch_size": "four"})))
    assert list(problems(error.value)) == ["args.per_device_train_batch_size"]
    assert "invalid int value: 'four'" in str(error.value)  # TRL's parser's own words


def test_a_value_of_the_wrong_kind_that_is_not_text_names_the_field():
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(load_spec(spec_dict(args={"per_device_train_batch_size": [4]})))
    assert list(problems(error.value)) == ["args.per_device_train_batch_size"]
    assert "expected int" in str(error.value)


def test_impossible_values_are_refused():
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(load_spec(spec_dict(args={"per_device_train_batch_size": 0, "max_length": 0})))
    assert set(problems(error.value)) == {"args.per_device_train_batch_size", "args.max_length"}


def test_a_negative_max_length_is_sfts_slice_and_refused_elsewhere_with_the_reason():
    """TRL truncates with `[:max_length]`: -5 drops five tokens of each example (SFT is planned so, with a
    warning); the other trainers' truncation with it is not planned, and the refusal says null was likely meant."""
    args = resolve_trainer_args(load_spec(spec_dict(args={"max_length": -5})))
    assert any(
        "max_length -5 does not turn truncation off" in note and "[:-5]" in note for note in args.notes
    )
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(load_spec(spec_dict(trainer="dpo", args={"max_length": -5})))
    assert "max_length: null turns truncation off" in problems(error.value)["args.max_length"]


def test_trl_rule_violations_are_reported_on_the_field():
    spec = load_spec(spec_dict(trainer="grpo", args={"num_generations": 3, "per_device_train_batch_size": 4}))
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(spec)
    assert "divisible by num_generations" in str(error.value)
    assert error.value.problems[0].loc == "args.num_generations"


def test_non_shape_fields_are_accepted():
    args = resolve_trainer_args(
        load_spec(
            spec_dict(args={"output_dir": "/somewhere", "logging_steps": 3, "save_steps": 7, "seed": 4})
        )
    )
    assert args.max_length == 1024


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ({"backend": "neuron", "device": "neuron"}, 128),
        ({"backend": "inductor", "device": "cuda"}, None),
        ({"backend": "inductor", "device": "cpu"}, None),
    ],
)
def test_pad_to_multiple_of_auto_resolves_per_target(target, expected):
    assert resolve_trainer_args(load_spec(spec_dict(target=target))).pad_to_multiple_of == expected
    explicit = load_spec(spec_dict(target=target, args={"pad_to_multiple_of": 64}))
    assert resolve_trainer_args(explicit).pad_to_multiple_of == 64
    cli_none = load_spec(spec_dict(target=target, args={"pad_to_multiple_of": "none"}))
    assert resolve_trainer_args(cli_none).pad_to_multiple_of is None


def test_use_cpu_makes_auto_resolve_to_no_padding_even_on_neuron():
    spec = load_spec(spec_dict(args={"use_cpu": True}))
    assert resolve_trainer_args(spec).pad_to_multiple_of is None


def test_grpo_generation_batch_uses_the_target_world_size():
    spec = load_spec(
        spec_dict(
            trainer="grpo",
            args={"per_device_train_batch_size": 2, "num_generations": 4, "gradient_accumulation_steps": 2},
            target={"backend": "neuron", "device": "neuron", "world_size": 4},
        )
    )
    args = resolve_trainer_args(spec)
    assert (args.steps_per_generation, args.generation_batch_size) == (2, 16)


def test_grpo_generation_batch_not_divisible_by_global_batch():
    spec = load_spec(
        spec_dict(
            trainer="grpo",
            args={"per_device_train_batch_size": 2, "num_generations": 2, "generation_batch_size": 12},
            target={"backend": "neuron", "device": "neuron", "world_size": 4},
        )
    )
    with pytest.raises(SpecError) as error:
        resolve_trainer_args(spec)
    assert error.value.problems[0].loc == "args.generation_batch_size"


def test_torch_compile_backend_must_match_target():
    spec = load_spec(spec_dict(args={"torch_compile_backend": "inductor"}))
    with pytest.raises(SpecError, match="does not match the target backend"):
        resolve_trainer_args(spec)


def test_grpo_eval_batch_is_checked_globally_for_the_target_world_size():
    args = {
        "per_device_train_batch_size": 2,
        "num_generations": 4,
        "per_device_eval_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "eval_strategy": "steps",
    }
    one = load_spec(spec_dict(trainer="grpo", args=args))
    with pytest.raises(SpecError, match="global eval batch size") as error:
        resolve_trainer_args(one)
    assert error.value.problems[0].loc == "args.per_device_eval_batch_size"
    two = load_spec(
        spec_dict(
            trainer="grpo", args=args, target={"backend": "neuron", "device": "neuron", "world_size": 2}
        )
    )
    assert resolve_trainer_args(two).per_device_eval_batch_size == 2


@pytest.fixture
def fresh_field_lists(tmp_path, monkeypatch):
    """trl_cli_fields computed anew, remembered in a memo folder of the test's own."""
    from warmup.job import spec

    monkeypatch.setenv("WARMUP_TOOLCHAIN_MEMO", str(tmp_path / "memo" / "toolchain.json"))
    spec.trl_cli_fields.cache_clear()
    yield tmp_path / "memo"
    spec.trl_cli_fields.cache_clear()


def test_the_trl_cli_field_lists_are_the_installed_trls():
    """A trl config is read with the field lists of the installed TRL, accelerate and transformers, whatever
    their versions (the shipped lists where they are the same versions, else computed from them)."""
    from warmup.job.spec import trl_cli_fields
    from warmup.job.trl_fields import build

    assert trl_cli_fields() == build()


def test_the_shipped_field_lists_are_the_locked_stacks():
    """warmup/data/trl_cli_fields.json, read where TRL is not installed, is the locked stack's (the test above
    holds it to that stack's TRL when it runs there)."""
    from pathlib import Path

    from warmup.job.spec import shipped_trl_cli_fields

    lock = Path(__file__).resolve().parents[2] / "constraints" / "locked.txt"
    pins = dict(line.lower().split("==") for line in lock.read_text().splitlines() if "==" in line)
    shipped = shipped_trl_cli_fields()
    assert {name: shipped[name] for name in ("trl", "accelerate", "transformers")} == {
        name: pins[name] for name in ("trl", "accelerate", "transformers")
    }, "the lock moved: python tools/trl_cli_fields.py > warmup/data/trl_cli_fields.json in its venv"


def test_a_base_install_without_trl_reads_the_shipped_lists(fresh_field_lists, monkeypatch):
    from warmup.job import spec, trl_fields

    monkeypatch.setattr(spec, "installed_trl_versions", lambda: None)
    monkeypatch.setattr(trl_fields, "build", lambda: pytest.fail("TRL is absent: nothing to build from"))
    assert spec.trl_cli_fields() == spec.shipped_trl_cli_fields()


def test_versions_other_than_the_shipped_lists_are_read_from_the_install_once(fresh_field_lists, monkeypatch):
    """An accelerate the shipped lists do not know (1.16 dropped an option of 1.15's) is read, not refused, and
    the lists computed for it are remembered for the next process of the same install."""
    from warmup.job import spec, trl_fields

    real = spec.shipped_trl_cli_fields()
    monkeypatch.setattr(spec, "shipped_trl_cli_fields", lambda: {**real, "accelerate": "0.0.0"})
    installed = spec.installed_trl_versions()
    assert installed is not None
    computed = spec.trl_cli_fields()
    assert computed == trl_fields.build() and computed["accelerate"] == installed["accelerate"]
    (memo,) = fresh_field_lists.glob("trl-cli-fields-*.json")
    assert installed["accelerate"] in memo.name
    spec.trl_cli_fields.cache_clear()
    monkeypatch.setattr(trl_fields, "build", lambda: pytest.fail("remembered: not built again"))
    assert spec.trl_cli_fields() == computed


@pytest.mark.parametrize(
    ("config", "target", "expected"),
    [
        ({"use_cpu": True}, None, ("inductor", "cpu")),  # the config says where it trains
        ({"use_cpu": "true"}, None, ("inductor", "cpu")),
        ({}, None, ("neuron", "neuron")),  # otherwise the default, Trainium
        ({"use_cpu": False}, None, ("neuron", "neuron")),
        (
            {"use_cpu": True},
            {"backend": "inductor", "device": "cuda"},
            ("inductor", "cuda"),
        ),  # a given target wins
    ],
)
def test_the_default_target_follows_the_configs_use_cpu(config, target, expected):
    spec = load_spec({"model_name_or_path": "Qwen/Qwen2.5-0.5B", **config}, trainer="sft", target=target)
    assert (spec.target.backend, spec.target.device) == expected
