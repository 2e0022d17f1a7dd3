"""Real configs, shrunk, against a real run: the shapes `warmup plan --dataset` lists are the ones TRL produces.

A handful of the files in tests/real_configs (TRL's own CLI documentation, one per trainer) are shrunk to
run here: the model becomes a tiny one, `dataset_name` a local dataset, and a CPU run gets `use_cpu`,
`bf16: false`, no saving or reporting, and `pad_to_multiple_of: 128` (what TRL's "auto" resolves to on
Neuron, the target these configs are planned for; on CPU "auto" does not pad). Every other field stays as
the file has it (batch sizes, max_length, generation settings: TRL's defaults where the file is silent).
Then the facts come from the dataset (`--dataset`) and the real run is TRL's own training script
(`trl.scripts.<trainer>.main`, as `trl <trainer> --config` runs it once launched), with every model
forward recorded.

The data are built so that the run meets every shape the plan lists whatever the sampler's order (the
rows of a batch share one padding bucket, and the example count leaves a short last batch), so the
planned and the seen sets can be compared for equality. GRPO's completions depend on what the model
generates: its prompt shapes (prefill) are compared for equality, its training widths for inclusion.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import random
from pathlib import Path

import pytest
import yaml

from tests.support.shape_recorder import ShapeRecorder
from tests.support.tiny_model import CORPUS, init_model, write_bpe_model
from warmup.cli import main
from warmup.trainers.registry import family

ROOT = Path(__file__).resolve().parents[2] / "real_configs"
WORDS = CORPUS.replace(",", "").replace(".", "").replace("?", "").replace(":", "").split()
SHRINK = {
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_strategy": "no",
    "disable_tqdm": True,
    "pad_to_multiple_of": 128,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    directory = write_bpe_model(tmp_path_factory.mktemp("shrunk-model"))
    init_model(directory).save_pretrained(
        directory
    )  # the scripts load the model (and DPO its reference) by path
    return directory


def text(rng: random.Random, tokens: int, tokenizer) -> str:
    """A text of exactly `tokens` tokens of the BPE tokenizer (grown word by word, trimmed by tokens)."""
    words: list[str] = []
    while len(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) < tokens:
        words.append(rng.choice(WORDS))
    ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def chat(role: str, content: str) -> list[dict]:
    return [{"role": role, "content": content}]


def dataset(kind: str, model: Path, directory: Path) -> Path:
    """Rows of 140-210 tokens (one padding bucket, 256) or, for GRPO, prompts of 20-60 tokens (bucket 128)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = random.Random(0)
    rows = []
    if kind == "sft":
        for _ in range(20):  # batches of 8, 8 and 4
            rows.append(
                {
                    "messages": chat("user", text(rng, 80, tokenizer))
                    + chat("assistant", text(rng, rng.randint(50, 110), tokenizer))
                }
            )
    elif kind in ("dpo", "reward"):
        for _ in range(12):  # batches of 8 and 4 pairs
            prompt = chat("user", text(rng, 80, tokenizer))
            rows.append(
                {
                    "prompt": prompt,
                    "chosen": chat("assistant", text(rng, rng.randint(50, 110), tokenizer)),
                    "rejected": chat("assistant", text(rng, rng.randint(50, 110), tokenizer)),
                }
            )
    elif kind == "kto":
        for i in range(12):
            rows.append(
                {
                    "prompt": chat("user", text(rng, rng.randint(80, 90), tokenizer)),
                    "completion": chat("assistant", text(rng, rng.randint(50, 100), tokenizer)),
                    "label": i % 2 == 0,
                }
            )
    else:  # grpo: one prompt (8 generations a step, 3 epochs), and the `solution` column accuracy_reward reads
        for _ in range(1):
            rows.append({"prompt": chat("user", text(rng, rng.randint(20, 60), tokenizer)), "solution": "1"})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def shrink(file: str, trainer: str, model: Path, data: Path, tmp_path: Path) -> Path:
    config = yaml.safe_load((ROOT / file).read_text())
    config.update(
        SHRINK, model_name_or_path=str(model), dataset_name=str(data), output_dir=str(tmp_path / "out")
    )
    path = tmp_path / f"{trainer}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def planned(config: Path, trainer: str, data: Path) -> set:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(
            [
                "plan",
                str(config),
                "--trainer",
                trainer,
                "--target",
                "cpu",
                "--dataset",
                str(data / "train.jsonl"),
                "--format",
                "json",
            ]
        )
    assert code == 0
    return {
        (s["phase"], s["batch"], s["seq_len"], s["cache_len"])
        for s in json.loads(out.getvalue())["signatures"]
    }


def run_script(config: Path, trainer: str) -> set:
    """`trl <trainer> --config` once launched: the script parses the file and runs its main()."""
    import trl

    module = importlib.import_module(f"trl.scripts.{trainer}")
    parsed = module.make_parser().parse_args_and_config(
        ["--config", str(config)], fail_with_unknown_args=False
    )
    recorder = ShapeRecorder()
    cls = getattr(trl, family(trainer).trainer_class)
    original = cls.train

    def train(self, *args, **kwargs):
        recorder.attach(self.model)
        if getattr(self, "ref_model", None) is not None:
            recorder.attach(self.ref_model, "ref")
        return original(self, *args, **kwargs)

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # a tiny model's ops are microseconds: OpenMP's barriers on a busy machine cost more
    cls.train = train
    try:
        module.main(*parsed)
    finally:
        cls.train = original
        torch.set_num_threads(threads)
    assert recorder.seen, "the run made no forward"
    return recorder.seen


CASES = [
    ("trl/docs-source-clis-L96.yaml", "sft"),
    ("trl/docs-source-clis-L111.yaml", "dpo"),
    ("trl/docs-source-clis-L126.yaml", "reward"),
    ("trl/docs-source-clis-L175.yaml", "kto"),
]


@pytest.mark.parametrize(("file", "trainer"), CASES, ids=[t for _, t in CASES])
def test_planned_shapes_are_the_run_shapes(file, trainer, model, tmp_path):
    data = dataset(trainer, model, tmp_path / "data")
    config = shrink(file, trainer, model, data, tmp_path)
    plan = planned(config, trainer, data)
    seen = run_script(config, trainer)
    assert seen == plan, f"run only: {sorted(seen - plan)}; plan only: {sorted(plan - seen)}"


def test_grpo_prompt_shapes_are_the_run_shapes(model, tmp_path):
    data = dataset("grpo", model, tmp_path / "data")
    config = shrink("trl/docs-source-clis-L141.yaml", "grpo", model, data, tmp_path)
    plan = planned(config, "grpo", data)
    seen = run_script(config, "grpo")
    prefill = {s for s in seen if s[0] == "generate_prefill"}
    assert prefill == {s for s in plan if s[0] == "generate_prefill"}
    trained = {s for s in seen if not s[0].startswith("generate_")}
    assert trained and trained <= plan, f"run only: {sorted(trained - plan)}"
