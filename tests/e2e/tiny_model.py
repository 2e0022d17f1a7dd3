"""A tiny Qwen3-style model directory built locally (config + word-level tokenizer, no weights).

Tests and benchmarks use it instead of a hub model: the machines are offline, and rehearsal only
reads a model's config and tokenizer. Words are `w0 .. wN`, one token each, so a text of n words is
n tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} {{ message['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def build_tiny_model(path: Path, *, vocab_size: int = 384, hidden_size: int = 64, layers: int = 2) -> Path:
    """Write config.json and a tokenizer for a tiny Qwen3 causal LM into `path`; return `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config

    path.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(vocab_size - len(SPECIAL_TOKENS) - 4)]
    # role names are words too, so the chat template tokenizes without unknown tokens
    vocab = {
        token: i for i, token in enumerate([*SPECIAL_TOKENS, "user", "assistant", "system", "<unk>", *words])
    }
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=vocab["<|pad|>"],
        eos_token_id=vocab["<|im_end|>"],
        bos_token_id=None,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(path)
    return path


def words(n: int, offset: int = 0) -> str:
    """A text of exactly n tokens under the tiny tokenizer."""
    return " ".join(f"w{(offset + i) % 300}" for i in range(n))


def save_weights(config_dir: Path, dest: Path, seed: int) -> Path:
    """A checkpoint of the tiny model with weights drawn from `seed` (the "user's" weights)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir), dtype=torch.float32)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (config_dir / name).exists():
            shutil.copy(config_dir / name, dest / name)
    return dest


if __name__ == "__main__":
    import sys

    print(json.dumps(str(build_tiny_model(Path(sys.argv[1])))))
