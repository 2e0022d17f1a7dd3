"""`warmup facts` on a 100k-example local JSONL dataset: throughput and peak memory, beside TRL's own preparation.

    python benchmarks/bench_facts.py [--examples 100000] [--baseline 10000]

Writes a tiny model with a byte-level BPE tokenizer and a ChatML template (tests/support/tiny_model.py) and a
JSONL file of chat examples (a user turn of 5-40 words, an assistant turn of 10-80), then:

1. runs `warmup facts CONFIG --trainer sft --dataset FILE` in a fresh process, as a user would: its own
   figures (examples tokenized per second, seconds in all) and the process's peak resident memory (VmHWM,
   from the kernel, read when it exits);
2. side by side, in another fresh process, TRL's own SFT preparation (`SFTTrainer._prepare_dataset`: chat
   template and tokenization one example at a time through `datasets.map`) on the first `--baseline`
   examples, the same work the facts repeat batched;
3. in a third fresh process, the ceiling of any exact pass on this machine: the tokenizer's Rust
   `encode_batch_fast` alone, over all the examples already rendered through the chat template (every
   core; the rendering itself not timed).

Prints the three rates and the ratios. Targets: at least 50k examples/s of tokenization, under 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASELINE = """
import sys, time, json
from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer
from tests.support.tiny_model import init_model
model_dir, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(line) for _, line in zip(range(n), open(data))]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
args = SFTConfig(output_dir=sys.argv[4], use_cpu=True, bf16=False, report_to="none", max_length=4096)
trainer = SFTTrainer(model=init_model(model_dir), args=args, train_dataset=Dataset.from_list(rows[:8]),
                     processing_class=tokenizer)
dataset = Dataset.from_list(rows)
started = time.perf_counter()
trainer._prepare_dataset(dataset, tokenizer, args, False, None, "train")
print(json.dumps({"examples": n, "seconds": time.perf_counter() - started}))
"""

ENCODER_ALONE = """
import sys, time, json
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
rows = [json.loads(line)["messages"] for line in open(sys.argv[2])]
texts = tokenizer.apply_chat_template(rows, tokenize=False)
started = time.perf_counter()
encoded = tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
seconds = time.perf_counter() - started
print(json.dumps({"examples": len(encoded), "seconds": seconds}))
"""


def write_data(path: Path, examples: int) -> None:
    from tests.support.tiny_model import CORPUS

    words = CORPUS.replace(",", "").replace(".", "").replace("?", "").replace(":", "").split()
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(examples):
            user = " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))
            assistant = " ".join(rng.choice(words) for _ in range(rng.randint(10, 80)))
            out.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": user},
                            {"role": "assistant", "content": assistant},
                        ]
                    }
                )
                + "\n"
            )


def peak_rss_mb(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run `command`; its peak resident set (VmHWM), read from /proc just before it is reaped."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:
        try:
            found = re.search(r"VmHWM:\s+(\d+) kB", status.read_text())
            if found:
                peak = max(peak, int(found.group(1)) / 1024)
        except OSError:
            pass
        time.sleep(0.05)
    out, err = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, out, err), peak


def timed_child(script: str, args: list[object], env: dict[str, str]) -> dict[str, float]:
    """Run `script` in a fresh Python process; the JSON it prints last ({"examples", "seconds"})."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument(
        "--baseline", type=int, default=10_000, help="examples TRL's own preparation is timed on"
    )
    ns = parser.parse_args()
    from tests.support.tiny_model import write_bpe_model

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = write_bpe_model(work / "model")
        data = work / "data" / "chat.jsonl"  # in a folder of its own: `trl` takes a folder as dataset_name
        data.parent.mkdir()
        write_data(data, ns.examples)
        config = work / "sft.yaml"
        config.write_text(f"model_name_or_path: {model}\ndataset_name: {data.parent}\nmax_length: 4096\n")
        facts, peak = peak_rss_mb(
            [
                sys.executable,
                "-m",
                "warmup",
                "facts",
                str(config),
                "--trainer",
                "sft",
                "--dataset",
                str(data),
            ],
            env,
        )
        if facts.returncode != 0:
            print(facts.stderr, file=sys.stderr)
            return 1
        summary = facts.stderr.strip().splitlines()[-1]
        found = re.search(r"tokenized in ([\d.]+) s \(([\d,]+) examples/s; ([\d.]+) s in all\)", summary)
        assert found, summary
        seconds, rate, total = (
            float(found.group(1)),
            float(found.group(2).replace(",", "")),
            float(found.group(3)),
        )
        tokens = re.search(r"max_tokens: (\d+)", facts.stdout)
        trl = timed_child(BASELINE, [model, data, ns.baseline, work / "out"], env)
        trl_rate = trl["examples"] / trl["seconds"]
        encoder = timed_child(ENCODER_ALONE, [model, data], env)
        encoder_rate = encoder["examples"] / encoder["seconds"]

    print(
        f"dataset: {ns.examples} chat examples (JSONL), longest {tokens.group(1) if tokens else '?'} tokens; {os.cpu_count()} cores"
    )
    print(
        f"warmup facts:            {rate:>9,.0f} examples/s ({seconds:.1f} s tokenizing, {total:.1f} s in all)"
    )
    print(
        f"TRL's own preparation:   {trl_rate:>9,.0f} examples/s ({trl['examples']} examples in {trl['seconds']:.1f} s)"
    )
    print(
        f"tokenizer alone (ceiling): {encoder_rate:>7,.0f} examples/s (Rust encode_batch_fast of the rendered texts)"
    )
    print(f"ratio facts / TRL:       {rate / trl_rate:>9.1f}x")
    print(f"facts / ceiling:         {rate / encoder_rate:>9.2f}")
    print(f"peak memory (VmHWM):     {peak:>9.0f} MB (target < 1024)")
    print(f"target 50,000 examples/s: {'met' if rate >= 50_000 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
