"""Tokenizer requests and responses (docs/text.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel.schemas.types import UtcDateTime


class TokenizerTrain(BaseModel):
    """Train a byte-level BPE tokenizer on a public text dataset's texts."""

    model_config = ConfigDict(extra="forbid")

    dataset_id: str = Field(max_length=40, description="a public text (jsonl) dataset you may read")
    vocab_size: int = Field(description="tokens to learn, special tokens included (at least 300)")
    name: str = Field(min_length=1, max_length=200)


class TokenizerOut(BaseModel):
    id: str = Field(description='"byte" for the built-in byte tokenizer, else a tok_ id')
    name: str
    kind: Literal["built-in", "uploaded", "trained"]
    vocab_size: int = Field(description="every token id is below it")
    pad_id: int = Field(description="the id text rows are right-padded with")
    special_tokens: dict[str, int] = Field(
        default_factory=dict, description="special tokens and their ids (pad, and bos/eos where the tokenizer has them)"
    )
    sha256: str | None = Field(description="SHA-256 of the stored tokenizer.json; null for the built-in one")
    size_bytes: int | None
    source: str | None = Field(description="where the owner says an uploaded tokenizer came from")
    trained_from_dataset_id: str | None = Field(description="the public dataset a trained tokenizer learned from")
    created_at: UtcDateTime | None = Field(description="null for the built-in tokenizer")
    links: dict[str, str]


class TokenizerList(BaseModel):
    items: list[TokenizerOut] = Field(description="the built-in byte tokenizer first, then yours, newest first")
