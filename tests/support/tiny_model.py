"""The tests' tiny model and tokenizer: `warmup.tiny_model`, which `warmup selftest` trains too."""

from warmup.tiny_model import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    VOCAB_WORDS,
    build_tokenizer,
    init_model,
    save_weights,
    words,
    write_tiny_model,
)

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "VOCAB_WORDS",
    "build_tokenizer",
    "init_model",
    "save_weights",
    "words",
    "write_tiny_model",
]
