"""``privtrain tokenizers``: public tokenizers for text datasets."""

from __future__ import annotations

from pathlib import Path

import click

from privtrain.cli.state import current_state, emit, json_flag
from privtrain.output import Column, key_values, table
from privtrain.resources import Tokenizer

TOKENIZER_COLUMNS: list[Column[Tokenizer]] = [
    Column("ID", lambda t: t.id),
    Column("NAME", lambda t: t.name, 30),
    Column("KIND", lambda t: t.kind),
    Column("VOCAB", lambda t: t.vocab_size),
    Column("PAD", lambda t: t.pad_id),
    Column("FROM", lambda t: t.trained_from_dataset_id or t.source, 40),
]


def _tokenizer_block(t: Tokenizer) -> str:
    return key_values(
        [
            ("id", t.id),
            ("name", t.name),
            ("kind", t.kind),
            ("vocabulary size", t.vocab_size),
            ("pad id", t.pad_id),
            ("special tokens", t.raw.get("special_tokens") or None),
            ("trained from", t.trained_from_dataset_id),
            ("source", t.source),
            ("sha256", t.sha256),
            ("created", t.created_at),
        ]
    )


@click.group("tokenizers")
def tokenizers() -> None:
    """Public tokenizers for text datasets: built-in byte, uploaded tokenizer.json, or trained on public text."""


@tokenizers.command("upload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="default: the file name without its suffix")
@click.option("--pad-token", help="the pad token, when the file sets no padding and has no <pad> or [PAD] token")
@click.option("--source", help="where the tokenizer came from")
@json_flag
def tokenizers_upload(path: Path, name: str | None, pad_token: str | None, source: str | None) -> None:
    """Upload a Hugging Face tokenizer.json (public: never one learned from private text)."""
    found = current_state().client().upload_tokenizer(path, name=name or path.stem, pad_token=pad_token, source=source)
    emit(found, lambda: _tokenizer_block(found))


@tokenizers.command("train")
@click.argument("dataset_id")
@click.option("--vocab-size", type=click.IntRange(min=1), required=True, help="tokens to learn (at least 300)")
@click.option("--name", required=True)
@json_flag
def tokenizers_train(dataset_id: str, vocab_size: int, name: str) -> None:
    """Train a byte-level BPE tokenizer on a PUBLIC text dataset (a private one is refused)."""
    found = current_state().client().train_tokenizer(dataset_id=dataset_id, vocab_size=vocab_size, name=name)
    emit(found, lambda: _tokenizer_block(found))


@tokenizers.command("list")
@json_flag
def tokenizers_list() -> None:
    """The built-in byte tokenizer, then yours, newest first."""
    found = current_state().client().list_tokenizers()
    emit(found, lambda: table(found, TOKENIZER_COLUMNS))


@tokenizers.command("show")
@click.argument("tokenizer_id")
@json_flag
def tokenizers_show(tokenizer_id: str) -> None:
    """One tokenizer: its kind, vocabulary size, pad id and special tokens."""
    found = current_state().client().get_tokenizer(tokenizer_id)
    emit(found, lambda: _tokenizer_block(found))
