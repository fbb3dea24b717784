"""Tiny JSON Lines bodies and tokenizer.json files for the text tests."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, models, pre_tokenizers

REVIEWS = (
    ("a fine film", "good"),
    ("dull and slow", "bad"),
    ("loved every minute", "good"),
    ("never again", "bad"),
    ("naïve but charming ☺", "good"),
    ("a waste of an evening", "bad"),
)


def jsonl(records: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8")


def classification_body(repeat: int = 4) -> bytes:
    return jsonl([{"text": text, "label": label} for text, label in REVIEWS * repeat])


def language_model_body(repeat: int = 4) -> bytes:
    return jsonl([{"text": text} for text, _ in REVIEWS * repeat])


def word_level_tokenizer_json(*, with_pad: bool = True) -> bytes:
    """A small word-level tokenizer.json, as a user would upload (made with the tokenizers library)."""
    vocab = {"[UNK]": 0, "a": 1, "fine": 2, "film": 3, "dull": 4, "and": 5}
    if with_pad:
        vocab["[PAD]"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return str(tokenizer.to_str()).encode("utf-8")
