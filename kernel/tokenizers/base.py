"""What a tokenizer must offer the text ingest: ids for texts, its vocabulary size and pad id.

Tokenizers are public by definition: their vocabulary is shown to everyone who may read a
dataset tokenised with them, and a job's model is sized by it. A tokenizer must therefore never
be learned from private text (kernel.tokenizer_registry refuses that).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

BYTE_TOKENIZER_ID = "byte"
"""The built-in byte-level tokenizer's id (kernel.tokenizers.byte)."""


class TextTokenizer(Protocol):
    @property
    def vocab_size(self) -> int:
        """Every id this tokenizer produces is below it (special tokens included)."""
        ...

    @property
    def pad_id(self) -> int:
        """The id rows are right-padded with; the models find padding as ``tokens == pad_id``."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, neither truncated nor padded (the ingest does both)."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...
