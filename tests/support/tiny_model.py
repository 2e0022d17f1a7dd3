"""The tests' tiny models and tokenizers: `warmup.tiny_model` (which `warmup selftest` trains too) with one layer,
and a byte-level BPE model whose lengths only the real tokenizer calls get right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warmup.tiny_model import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    VOCAB_WORDS,
    build_tokenizer,
    init_model,
    save_weights,
    words,
)
from warmup.tiny_model import write_tiny_model as _write_tiny_model

__all__ = [
    "CHATML_TEMPLATE",
    "CHAT_TEMPLATE",
    "CORPUS",
    "SPECIAL_TOKENS",
    "VOCAB_WORDS",
    "build_tokenizer",
    "init_model",
    "save_weights",
    "words",
    "write_bpe_model",
    "write_tiny_model",
]

# One decoder layer, where `warmup selftest` builds two. The end-to-end proofs compile this model again and again
# (each into a fresh cache, as they must); a second layer is the same ops again, so it adds no kernel, graph or
# shape a proof checks, and costs about a fifth of every compile and every warm training run (README, Contributing).
TEST_LAYERS = 1


def write_tiny_model(directory: Path, *, layers: int = TEST_LAYERS, **options: Any) -> Path:
    """`warmup.tiny_model.write_tiny_model`, one layer unless a test asks for more (a distillation teacher)."""
    return _write_tiny_model(directory, layers=layers, **options)


CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = (
    "the sky is blue because air scatters short wavelengths of sunlight more than long ones, "
    "so a clear day looks blue and a sunset looks red. what color is grass? grass is green. "
    "count to ten: one two three four five six seven eight nine ten. tokens merge across words "
    "when a byte pair encoder learned them together, so a prompt may not end on a token boundary."
)


def write_bpe_model(directory: Path, *, bos: bool = True) -> Path:
    """A tiny Qwen3 config with a byte-level BPE tokenizer trained here, a ChatML template, and (with `bos`) a
    post-processor that adds <bos> to plain text, as Llama's does: lengths that only the real calls get right."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config

    specials = ["<pad>", "<eos>", "<bos>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    backend.train_from_iterator([CORPUS] * 20, trainer=trainer)
    if bos:
        bos_id = backend.token_to_id("<bos>")
        backend.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos_id)]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML_TEMPLATE
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=131072,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        architectures=["Qwen3ForCausalLM"],
    )
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
