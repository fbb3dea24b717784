"""Tokenizers for text datasets (kernel/tokenizers/): the byte tokenizer round-trips every text,
uploaded tokenizer.json files are checked (loadable, vocabulary bounds, a pad token), and a
trained BPE encodes any text and decodes it back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.errors import InvalidInput
from kernel.tokenizers.byte import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer
from kernel.tokenizers.hugging_face import load_tokenizer_json, train_bpe
from tests.text_fixtures import word_level_tokenizer_json

# Text a JSON upload can hold: any Unicode scalar value (lone surrogates cannot be UTF-8).
unicode_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(text=unicode_text)
def test_byte_tokenizer_encode_then_decode_is_the_identity(text: str) -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


@settings(max_examples=50, deadline=None)
@given(text=unicode_text, padding=st.integers(0, 5))
def test_byte_tokenizer_decoding_ignores_padding_and_special_tokens(text: str, padding: int) -> None:
    tokenizer = ByteTokenizer()
    assert tokenizer.decode([BOS_ID, *tokenizer.encode(text), EOS_ID, *[PAD_ID] * padding]) == text


def test_byte_tokenizer_ids_are_documented() -> None:
    tokenizer = ByteTokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID, VOCAB_SIZE) == (256, 257, 258, 259)
    assert tokenizer.vocab_size == 259 and tokenizer.pad_id == 256
    assert tokenizer.encode_batch(["A", "€"]) == [[65], [0xE2, 0x82, 0xAC]]


def test_an_uploaded_tokenizer_finds_its_pad_token() -> None:
    loaded = load_tokenizer_json(word_level_tokenizer_json(), pad_token=None, max_vocab=1000)
    assert loaded.vocab_size == 7 and loaded.pad_id == 6
    assert loaded.encode_batch(["a fine film", "dull"]) == [[1, 2, 3], [4]]
    named = load_tokenizer_json(word_level_tokenizer_json(with_pad=False), pad_token="[UNK]", max_vocab=1000)
    assert named.pad_id == 0


@pytest.mark.parametrize(
    ("body", "pad_token", "max_vocab", "slug"),
    [
        (b"{not json", None, 1000, "invalid-tokenizer"),
        (b'{"model": 3}', None, 1000, "invalid-tokenizer"),
        (b"\xff\xfe", None, 1000, "invalid-tokenizer"),
        (word_level_tokenizer_json(with_pad=False), None, 1000, "tokenizer-without-pad"),
        (word_level_tokenizer_json(), "<missing>", 1000, "tokenizer-without-pad"),
        (word_level_tokenizer_json(), None, 5, "tokenizer-vocab-size"),
    ],
)
def test_a_bad_tokenizer_file_is_refused(body: bytes, pad_token: str | None, max_vocab: int, slug: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        load_tokenizer_json(body, pad_token=pad_token, max_vocab=max_vocab)
    assert refused.value.slug == slug


def test_a_trained_bpe_round_trips_text_it_never_saw_and_survives_storage() -> None:
    trained = train_bpe(["the cat sat on the mat"] * 20 + ["a dog ran"] * 20, vocab_size=300)
    assert trained.pad_id == 0 and 256 < trained.vocab_size <= 300
    unseen = "zebra ünïcödé 🙂"
    assert trained.decode(trained.encode_batch([unseen])[0]) == unseen
    reloaded = load_tokenizer_json(trained.to_json().encode(), pad_token=None, max_vocab=1000)
    assert reloaded.pad_id == 0 and reloaded.encode_batch(["the cat"]) == trained.encode_batch(["the cat"])
    assert len(trained.encode_batch(["the cat sat"])[0]) < len("the cat sat")  # merges were learned
