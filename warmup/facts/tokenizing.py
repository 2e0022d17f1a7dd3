"""The tokenizer calls TRL's trainers make one example at a time in 1.16, made on batches.

Batches are encoded with the tokenizer's Rust fast path (which releases the GIL), and chat templates are
rendered directly where transformers' preparation of the messages would change nothing.
"""

from __future__ import annotations

from typing import Any

from warmup.errors import DatasetError
from warmup.facts.opening import first_line
from warmup.facts.recipe import Recipe


class Tokenize:
    """Batched versions of the tokenizer calls TRL's trainers make, one example at a time, in 1.16."""

    def __init__(self, recipe: Recipe) -> None:
        from transformers import AutoTokenizer

        self.recipe = recipe
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(recipe.model)
        except Exception as error:
            raise DatasetError(
                f"cannot load the tokenizer of {recipe.model!r}: {first_line(error)}", loc="model"
            ) from None
        if recipe.eos_token is not None:  # SFTTrainer sets it on the tokenizer before preparing data
            self.tokenizer.eos_token = recipe.eos_token
        self.backend = getattr(self.tokenizer, "_tokenizer", None) if self.tokenizer.is_fast else None
        self.checked = False
        self.renderer = _Renderer(self.tokenizer, recipe.chat_template)

    def text(self, texts: list[str]) -> list[list[int]]:
        """`processing_class(text=...)` (TRL's `_tokenize` for plain text): special tokens added."""
        return self._encode(texts, add_special_tokens=True)

    def chat(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        generation_prompt: bool,
        kwargs: list[dict[str, Any]],
    ) -> list[list[int]]:
        """`apply_chat_template(conversation, tokenize=True, ...)`: rendered, then encoded without special tokens.

        `kwargs` holds each example's own arguments (`tools`, `chat_template_kwargs`); examples that share
        them are rendered in one call.
        """
        rendered: list[str] = [""] * len(conversations)
        groups: dict[str, list[int]] = {}
        for index, own in enumerate(kwargs):
            groups.setdefault(repr(sorted(own.items())) if own else "", []).append(index)
        for indices in groups.values():
            texts = self.renderer.render(
                [conversations[i] for i in indices],
                generation_prompt=generation_prompt,
                kwargs=kwargs[indices[0]],
            )
            for i, text in zip(indices, texts, strict=True):
                rendered[i] = text
        return self._encode(rendered, add_special_tokens=False)

    def _encode(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        if not texts:
            return []
        if self.backend is not None:
            ids = [
                encoding.ids
                for encoding in self.backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
            ]
            if not self.checked:
                # The Rust backend directly is the tokenizer's own fast path; hold it to __call__ once, on a few
                # texts, and take the slow path for good if a tokenizer adds something in Python.
                probe = self.tokenizer(texts[:8], add_special_tokens=add_special_tokens)["input_ids"]
                if list(probe) != ids[:8]:
                    self.backend = None
                    return self._encode(texts, add_special_tokens=add_special_tokens)
                self.checked = True
            return ids
        return list(self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"])

    def assistant_masks(
        self, conversations: list[list[dict[str, Any]]], kwargs: list[dict[str, Any]]
    ) -> list[list[int]]:
        """`return_assistant_tokens_mask=True` (SFT's assistant_only_loss), one call per example as TRL makes it."""
        masks = []
        for conversation, own in zip(conversations, kwargs, strict=True):
            out = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                chat_template=self.recipe.chat_template,
                **own,
            )
            masks.append(list(out["assistant_masks"]))
        return masks


class _Renderer:
    """`apply_chat_template(..., tokenize=False)`, with the template rendered directly where that is the same.

    transformers prepares each conversation before rendering it (message objects to dicts, keys with None
    values dropped, everything rebuilt from plain JSON types, reasoning fields aliased), which costs more than
    the rendering. For messages that are already plain dicts of strings with no None and no reasoning field,
    that preparation returns them unchanged, so the compiled template renders them directly with the arguments
    transformers passes. The first conversation of every batch is rendered both ways; if they ever differ,
    every later conversation takes transformers' own path.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.direct = True
        from warmup._compat import transformers as compat_transformers

        compiler = compat_transformers.chat_template_compiler()
        if compiler is None:  # another transformers: its own path only
            self.direct = False
        else:
            self.reasoning, self.compile = compiler

    def render(
        self, conversations: list[list[dict[str, Any]]], *, generation_prompt: bool, kwargs: dict[str, Any]
    ) -> list[str]:
        def hf(batch: list[list[dict[str, Any]]]) -> list[str]:
            return self.tokenizer.apply_chat_template(  # type: ignore[no-any-return]
                batch,
                tokenize=False,
                add_generation_prompt=generation_prompt,
                chat_template=self.chat_template,
                **kwargs,
            )

        if not self.direct or kwargs or not conversations:
            return hf(conversations)
        template = self.compile(self.tokenizer.get_chat_template(self.chat_template, None))
        context = {**self.tokenizer.special_tokens_map, "tools": None, "documents": None}
        out: list[str] = []
        plain = self._plain
        for conversation in conversations:
            if plain(conversation):
                out.append(
                    template.render(messages=conversation, add_generation_prompt=generation_prompt, **context)
                )
            else:
                out.append(hf([conversation])[0])
        if out[0] != hf(conversations[:1])[0]:
            self.direct = False
            return hf(conversations)
        return out

    def _plain(self, conversation: Any) -> bool:
        if type(conversation) is not list or not conversation:
            return False
        for message in conversation:
            if type(message) is not dict:
                return False
            for key, value in message.items():
                if type(value) is not str or type(key) is not str or key in self.reasoning:
                    return False
        return True
