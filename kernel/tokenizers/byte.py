"""The built-in byte-level tokenizer: a text's UTF-8 bytes are its ids, so there is no vocabulary
to ship or to learn, and every text round-trips exactly.

Ids 0..255 are the bytes; then three special tokens: 256 pad, 257 bos (begin of sequence), 258
eos (end of sequence). ``vocab_size`` is 259. Encoding adds no bos or eos: a row holds the text's
bytes, truncated at ``max_length`` and right-padded with 256.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

BYTE_VALUES: Final = 256
PAD_ID: Final = 256
BOS_ID: Final = 257
EOS_ID: Final = 258
VOCAB_SIZE: Final = 259


class ByteTokenizer:
    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    @property
    def pad_id(self) -> int:
        return PAD_ID

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the byte ids; special tokens are dropped, and a sequence cut inside a
        character (by truncation) decodes that character as U+FFFD."""
        return bytes(i for i in ids if 0 <= i < BYTE_VALUES).decode("utf-8", errors="replace")
