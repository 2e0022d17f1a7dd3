"""A tiny Qwen3-style model and a word-level tokenizer, built locally: nothing is downloaded.

What `warmup selftest` trains, and what the tests use. Every word `w<i>` is exactly one token, so a
text of n words is n tokens: data of exact token lengths is easy to build. Configs are written and
weights initialised from them (2 layers, 64 wide: compiles in seconds, runs on any device).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB_WORDS = 200
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for word in ["user:", "assistant:", "system:"] + [f"w{i}" for i in range(VOCAB_WORDS)]:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_tiny_model(
    directory: Path,
    *,
    seq_classification: bool = False,
    layers: int = 2,
    hidden: int = 64,
    max_position_embeddings: int = 4096,
) -> Path:
    """Write config.json and the tokenizer of a tiny Qwen3 model into `directory` (no weights)."""
    from transformers import Qwen3Config

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
        architectures=["Qwen3ForSequenceClassification" if seq_classification else "Qwen3ForCausalLM"],
        num_labels=1,
    )
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def init_model(directory: Path, *, seed: int = 0) -> Any:
    """Weights initialised from the config (a seed makes them differ between runs that must not care)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(directory)
    if config.architectures and config.architectures[0].endswith("ForSequenceClassification"):
        return AutoModelForSequenceClassification.from_config(config)
    return AutoModelForCausalLM.from_config(config)


def save_weights(config_dir: Path, dest: Path, seed: int) -> Path:
    """A checkpoint of the tiny model with weights drawn from `seed` (the "user's" weights)."""
    import shutil

    model = init_model(config_dir, seed=seed)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (config_dir / name).exists():
            shutil.copy(config_dir / name, dest / name)
    return dest


def words(n: int, offset: int = 0) -> str:
    """A text of exactly n tokens."""
    return " ".join(f"w{(offset + i) % VOCAB_WORDS}" for i in range(n))
