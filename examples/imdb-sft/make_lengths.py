"""Write what `warmup advise` needs for TRL's example SFT config on a machine without network access.

- `lengths.json`: 25,000 token lengths with the shape of stanfordnlp/imdb's train split under Qwen2.5's
  tokenizer (a review is a median of about 230 tokens, a mean of about 290, one in a hundred past 1,000 and the
  longest about 3,000; log-normal, seeded), plus the EOS SFT appends. Generated, not read from the dataset.
- `Qwen2.5-0.5B/config.json`: the published config of Qwen/Qwen2.5-0.5B (only the config is read), and
  `sft-local.yaml`: sft.yaml pointing at it.

    python examples/imdb-sft/make_lengths.py OUT && warmup advise OUT/sft-local.yaml --trainer sft \\
        --backend neuron --device neuron --world-size 4 --lengths OUT/lengths.json --max-truncated 0.01
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def imdb_like(count: int = 25_000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [min(max(round(rng.lognormvariate(math.log(230), 0.65)), 12), 3200) + 1 for _ in range(count)]


def main(out: Path) -> None:
    here = Path(__file__).resolve().parent
    model = out / "Qwen2.5-0.5B"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(QWEN25_05B, indent=2))
    (out / "lengths.json").write_text(json.dumps({"train": imdb_like()}))
    config = (here / "sft.yaml").read_text().replace("Qwen/Qwen2.5-0.5B", str(model))
    (out / "sft-local.yaml").write_text(config)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
