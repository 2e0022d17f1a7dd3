"""Data facts against TRL itself: the lengths `warmup.facts` computes are the ones TRL's trainers produce.

Each case writes a small dataset in one of TRL's formats to a JSONL file, computes its facts, then builds
the real TRL trainer on the same data (the tiny model, weights from its config) and reads back what the
trainer's own preparation made of every example: SFT's `input_ids` (packed or not), DPO's and KTO's
prompt / completion ids, Reward's chosen / rejected ids, GRPO's and RLOO's tokenized prompts. The
tokenizer is a byte-level BPE that adds <bos> to plain text and merges tokens across the prompt /
completion boundary, so lengths are right only if the calls are TRL's own.
"""

from __future__ import annotations

import json
import random

import pytest

from tests.support.shape_recorder import CPU_ARGS
from tests.support.tiny_model import CORPUS, init_model, write_bpe_model
from warmup.facts.reading import dataset_facts
from warmup.job.spec import load_spec

INDUCTOR_CPU = {"backend": "inductor", "device": "cpu"}
# The comparisons build TRL's real trainers: integration tests, not unit tests.
WORDS = CORPUS.replace(",", "").replace(".", "").replace("?", "").replace(":", "").split()


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    directory = write_bpe_model(tmp_path_factory.mktemp("bpe-model"))
    init_model(directory).save_pretrained(directory)  # DPO / KTO / RLOO load their reference model from it
    return directory


def text(rng: random.Random, low: int, high: int) -> str:
    # Words joined without a trailing space: prompts often end inside a mergeable span.
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def chat(role: str, content: str) -> list[dict[str, str]]:
    return [{"role": role, "content": content}]


def rows(kind: str, n: int = 40, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, c, r = text(rng, 1, 30), text(rng, 1, 30), text(rng, 1, 30)
        out.append(
            {
                "text": {"text": p + " " + c},
                "messages": {"messages": chat("user", p) + chat("assistant", c)},
                "conversations": {
                    "conversations": [{"from": "user", "value": p}, {"from": "assistant", "value": c}]
                },
                "prompt_completion": {"prompt": p, "completion": " " + c},
                "chat_prompt_completion": {"prompt": chat("user", p), "completion": chat("assistant", c)},
                "preference": {"prompt": p, "chosen": " " + c, "rejected": " " + r},
                "chat_preference": {
                    "prompt": chat("user", p),
                    "chosen": chat("assistant", c),
                    "rejected": chat("assistant", r),
                },
                "implicit_preference": {
                    "chosen": chat("user", p) + chat("assistant", c),
                    "rejected": chat("user", p) + chat("assistant", r),
                },
                "unpaired": {
                    "prompt": chat("user", p),
                    "completion": chat("assistant", c),
                    "label": rng.random() < 0.5,
                },
                "prompt": {"prompt": p},
                "chat_prompt": {"prompt": chat("user", p)},
            }[kind]
        )
    return out


def write(tmp_path, kind: str, n: int = 40):
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows(kind, n)))
    return path


def spec_for(model, trainer: str, args: dict):
    return load_spec({"trainer": trainer, "model": str(model), "args": args, "target": INDUCTOR_CPU})


def trl_trainer(model, trainer: str, args: dict, path, tmp_path):
    import trl
    from datasets import load_dataset
    from transformers import AutoTokenizer

    dataset = load_dataset("json", data_files={"train": str(path)})["train"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    names = {
        "sft": ("SFTConfig", "SFTTrainer"),
        "dpo": ("DPOConfig", "DPOTrainer"),
        "kto": ("KTOConfig", "KTOTrainer"),
        "reward": ("RewardConfig", "RewardTrainer"),
        "grpo": ("GRPOConfig", "GRPOTrainer"),
        "rloo": ("RLOOConfig", "RLOOTrainer"),
    }
    config_name, trainer_name = names[trainer]
    config = getattr(trl, config_name)(output_dir=str(tmp_path / "out"), **CPU_ARGS, **args)
    extra = (
        {"reward_funcs": lambda completions, **_: [0.0] * len(completions)}
        if trainer in ("grpo", "rloo")
        else {}
    )
    model_obj = init_model(model)
    if trainer == "reward":
        from transformers import AutoModelForSequenceClassification, Qwen3Config

        model_obj = AutoModelForSequenceClassification.from_config(
            Qwen3Config.from_pretrained(model, num_labels=1)
        )
        model_obj.config.pad_token_id = tokenizer.pad_token_id
    return getattr(trl, trainer_name)(
        model=model_obj, args=config, train_dataset=dataset, processing_class=tokenizer, **extra
    )


SFT_CASES = [
    ("text", {}),
    ("messages", {}),
    ("conversations", {}),
    ("prompt_completion", {}),
    ("chat_prompt_completion", {}),
]


@pytest.mark.parametrize(("kind", "extra"), SFT_CASES)
def test_sft_lengths_are_trls(bpe_model, tmp_path, kind, extra):
    args = {"max_length": 4096, **extra}
    path = write(tmp_path, kind)
    facts = dataset_facts(spec_for(bpe_model, "sft", args), path)
    trainer = trl_trainer(bpe_model, "sft", args, path, tmp_path)
    truth = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    assert list(facts.train.lengths) == truth
    assert facts.data.num_train_examples == len(truth)
    assert facts.data.max_tokens == max(truth) and facts.data.min_tokens == min(truth)


def test_sft_drops_the_examples_trl_drops(bpe_model, tmp_path):
    """A prompt that alone fills max_length leaves no completion token to learn from: TRL drops the example."""
    args = {"max_length": 26}
    path = write(tmp_path, "chat_prompt_completion")
    facts = dataset_facts(spec_for(bpe_model, "sft", args), path)
    trainer = trl_trainer(bpe_model, "sft", args, path, tmp_path)
    assert facts.train.dropped > 0
    assert facts.data.num_train_examples == len(trainer.train_dataset)
    truth = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    assert [min(n, 26) for n in facts.train.lengths] == truth  # facts are untruncated; TRL truncated them


@pytest.mark.parametrize(
    "args",
    [
        {"packing": True, "max_length": 64},
        {"packing": True, "max_length": 64, "packing_strategy": "wrapped"},
        {"packing": True, "max_length": 48, "shuffle_dataset": True, "seed": 7},
    ],
)
def test_sft_packed_rows_are_trls(bpe_model, tmp_path, args):
    path = write(tmp_path, "messages", n=1500)  # two map batches of TRL's packing
    facts = dataset_facts(spec_for(bpe_model, "sft", args), path, workers=1)
    trainer = trl_trainer(bpe_model, "sft", args, path, tmp_path)
    truth = sorted(len(ids) for ids in trainer.train_dataset["input_ids"])
    assert sorted(facts.train.packed_lengths) == truth
    assert facts.data.num_train_rows == len(truth)  # the packed rows batches are made of
    assert facts.data.num_train_examples == 1500  # the dataset's examples, as users mean the count


@pytest.mark.parametrize("kind", ["preference", "chat_preference", "implicit_preference"])
def test_dpo_rows_and_prompts_are_trls(bpe_model, tmp_path, kind):
    args = {"max_length": 4096}
    path = write(tmp_path, kind)
    facts = dataset_facts(spec_for(bpe_model, "dpo", args), path)
    data = trl_trainer(bpe_model, "dpo", args, path, tmp_path).train_dataset
    truth = []
    for prompt, chosen, rejected in zip(
        data["prompt_ids"], data["chosen_ids"], data["rejected_ids"], strict=True
    ):
        truth += [len(prompt) + len(chosen), len(prompt) + len(rejected)]
    assert list(facts.train.lengths) == truth
    assert list(facts.train.prompt_lengths) == [len(p) for p in data["prompt_ids"]]


def test_dpo_drops_prompts_that_fill_max_length(bpe_model, tmp_path):
    args = {"max_length": 14}
    path = write(tmp_path, "chat_preference")
    facts = dataset_facts(spec_for(bpe_model, "dpo", args), path)
    data = trl_trainer(bpe_model, "dpo", args, path, tmp_path).train_dataset
    assert facts.train.dropped > 0 and facts.data.num_train_examples == len(data)


@pytest.mark.parametrize("kind", ["unpaired", "chat_preference"])
def test_kto_rows_are_trls(bpe_model, tmp_path, kind):
    args = {"max_length": 4096, "per_device_train_batch_size": 2}
    path = write(tmp_path, kind)
    facts = dataset_facts(spec_for(bpe_model, "kto", args), path)
    data = trl_trainer(bpe_model, "kto", args, path, tmp_path).train_dataset
    truth = [len(p) + len(c) for p, c in zip(data["prompt_ids"], data["completion_ids"], strict=True)]
    # TRL unpairs the whole dataset (all chosen rows, then all rejected); facts unpair batch by batch: same rows.
    assert sorted(facts.train.lengths) == sorted(truth)
    assert facts.data.num_train_examples == len(truth)


@pytest.mark.parametrize(
    ("kind", "max_length"), [("preference", 4096), ("chat_preference", 4096), ("chat_preference", 30)]
)
def test_reward_rows_are_trls(bpe_model, tmp_path, kind, max_length):
    args = {"max_length": max_length}
    path = write(tmp_path, kind)
    facts = dataset_facts(spec_for(bpe_model, "reward", args), path)
    data = trl_trainer(bpe_model, "reward", args, path, tmp_path).train_dataset
    truth = []
    for chosen, rejected in zip(data["chosen_ids"], data["rejected_ids"], strict=True):
        truth += [len(chosen), len(rejected)]
    assert list(facts.train.lengths) == truth
    assert facts.data.num_train_examples == len(data)


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
@pytest.mark.parametrize("kind", ["prompt", "chat_prompt"])
def test_online_prompts_are_trls(bpe_model, tmp_path, trainer, kind):
    args = {"per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 8}
    path = write(tmp_path, kind)
    facts = dataset_facts(spec_for(bpe_model, trainer, args), path)
    built = trl_trainer(bpe_model, trainer, args, path, tmp_path)
    prompts = [row["prompt"] for row in rows(kind)]
    truth = [len(ids) for ids in built._tokenize_prompts(prompts)[0]]
    assert list(facts.train.prompt_lengths) == truth
    assert facts.data.max_prompt_tokens == max(truth) and facts.data.min_prompt_tokens == min(truth)
    assert facts.data.max_tokens is None  # no rows before generation


def test_parallel_workers_give_the_same_lengths_in_order(bpe_model, tmp_path):
    path = write(tmp_path, "chat_prompt_completion", n=2500)
    spec = spec_for(bpe_model, "sft", {"max_length": 4096})
    alone = dataset_facts(spec, path, workers=1)
    together = dataset_facts(spec, path, workers=2)
    assert list(alone.train.lengths) == list(together.train.lengths)
    assert alone.data == together.data


def test_sample_reads_that_many_and_says_it_is_an_estimate(bpe_model, tmp_path):
    path = write(tmp_path, "messages", n=100)
    facts = dataset_facts(spec_for(bpe_model, "sft", {}), path, sample=10)
    assert facts.train.examples == 10
    assert facts.data.estimated_from == 10
    assert "ESTIMATE" in facts.data_block()
