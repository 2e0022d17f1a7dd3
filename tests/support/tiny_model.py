"""A tiny Qwen3-style model and a word-level tokenizer, built locally (the machines are offline).

Every word `w<i>` is exactly one token, so a text of n words is n tokens: tests can build data of
exact token lengths. The model is never downloaded: configs are written, weights are initialised.
"""

from __future__ import annotations

from pathlib import Path

VOCAB_WORDS = 200
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer():
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


def write_tiny_model(directory: Path, *, seq_classification: bool = False, layers: int = 2) -> Path:
    """Write config.json and the tokenizer of a tiny Qwen3 model into `directory` (no weights)."""
    from transformers import Qwen3Config

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
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


def init_model(directory: Path, *, seed: int = 0):
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
