"""Hugging Face ``tokenizer.json`` files: loaded and checked with the ``tokenizers`` library (no
network), and BPE tokenizers trained on public text.

A loaded tokenizer is used only to encode: its own truncation and padding are switched off (the
ingest truncates at the dataset's ``max_length`` and pads with the pad id found here).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kernel.bounded_json import nesting_depth
from kernel.errors import InvalidInput

PAD_NAMES: Final = ("<pad>", "[PAD]", "<|pad|>", "<PAD>")
"""Special tokens taken for the pad token when the file sets no padding and none is named."""
TRAINED_SPECIAL_TOKENS: Final = ("<pad>", "<bos>", "<eos>")
"""A trained tokenizer's special tokens: ids 0 (pad), 1 (bos) and 2 (eos)."""
MAX_TOKENIZER_DEPTH: Final = 64
"""Nesting of a tokenizer.json's arrays and objects; real ones nest fewer than 10 levels."""
MIN_TRAINED_VOCAB: Final = 300
"""A trained byte-level BPE starts from the 256 byte symbols and the special tokens."""


class HuggingFaceTokenizer:
    """A ``tokenizers.Tokenizer`` and the pad id the ingest pads with."""

    def __init__(self, tokenizer: Tokenizer, *, pad_id: int) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._pad_id = pad_id

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def pad_id(self) -> int:
        return self._pad_id

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(encoding.ids) for encoding in self._tokenizer.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

    def to_json(self) -> str:
        return str(self._tokenizer.to_str())


def _invalid(slug: str, detail: str) -> InvalidInput:
    return InvalidInput(slug=slug, detail=detail)


def load_tokenizer_json(data: bytes, *, pad_token: str | None, max_vocab: int) -> HuggingFaceTokenizer:
    """Parse and check a ``tokenizer.json``: UTF-8 text nested at most MAX_TOKENIZER_DEPTH deep
    (checked before the library parses it), it loads, its vocabulary size is within bounds, and it
    has a pad token (``pad_token``, else its padding setting, else a special token named like one)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("invalid-tokenizer", "the body is not UTF-8 text, which a tokenizer.json is") from None
    if nesting_depth(text) > MAX_TOKENIZER_DEPTH:  # bounded here, whatever the library's own parser does
        raise _invalid("invalid-tokenizer", f"the tokenizer.json nests more than {MAX_TOKENIZER_DEPTH} levels deep")
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the library raises plain Exception on a malformed file
        raise _invalid(
            "invalid-tokenizer",
            f"the body is not a Hugging Face tokenizer.json the tokenizers library can load ({type(exc).__name__})",
        ) from None
    vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    if not 2 <= vocab_size <= max_vocab:
        raise _invalid(
            "tokenizer-vocab-size", f"the tokenizer has {vocab_size} tokens; between 2 and {max_vocab} are allowed"
        )
    pad_id = _pad_id(tokenizer, pad_token=pad_token)
    if not 0 <= pad_id < vocab_size:
        raise _invalid("tokenizer-without-pad", f"the pad id {pad_id} is outside the vocabulary of {vocab_size}")
    return HuggingFaceTokenizer(tokenizer, pad_id=pad_id)


def stored_tokenizer(data: bytes, *, pad_id: int) -> HuggingFaceTokenizer:
    """A registered tokenizer (checked when it was registered) with its recorded pad id."""
    return HuggingFaceTokenizer(Tokenizer.from_str(data.decode("utf-8")), pad_id=pad_id)


def _pad_id(tokenizer: Tokenizer, *, pad_token: str | None) -> int:
    if pad_token is not None:
        named = tokenizer.token_to_id(pad_token)
        if named is None:
            raise _invalid("tokenizer-without-pad", f"pad_token {pad_token!r} is not a token of this tokenizer")
        return int(named)
    padding = tokenizer.padding
    if padding is not None:
        return int(padding["pad_id"])
    for name in PAD_NAMES:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    raise _invalid(
        "tokenizer-without-pad",
        "the tokenizer defines no pad token (no padding setting and no token named "
        f"{', '.join(PAD_NAMES)}); name one of its tokens with pad_token=",
    )


def train_bpe(texts: Iterable[str], *, vocab_size: int) -> HuggingFaceTokenizer:
    """A byte-level BPE tokenizer learned from ``texts`` (which must be public): every text is
    encodable (the byte alphabet is always in the vocabulary) and decodes back to itself."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TRAINED_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    pad_id = tokenizer.token_to_id(TRAINED_SPECIAL_TOKENS[0])
    assert pad_id is not None
    return HuggingFaceTokenizer(tokenizer, pad_id=int(pad_id))
