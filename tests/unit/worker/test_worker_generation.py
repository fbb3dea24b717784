"""The sampler behind ``POST /v1/jobs/{id}/generate``: greedy continuations, the context window,
end tokens, top-k, and the child's whole answer from a saved transformer-lm (byte tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from kernel.tokenizers import byte
from privtrain_common.model_files import save_model
from privtrain_common.zoo.architectures import build_model
from worker.generation import EndsAndPad, SamplingChoice, answer, sample_continuation

VOCAB = 12
PAD = 11
NO_ENDS = EndsAndPad(pad_id=PAD, stop_ids=frozenset())
GREEDY = SamplingChoice(temperature=0.0, top_k=None)


class NextIsPlusOne(nn.Module):
    """Logits peaked at (token + 1) mod 10 at every real position; padding predicts the pad id."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros((*tokens.shape, VOCAB))
        following = torch.where(tokens == PAD, PAD, (tokens + 1) % 10)
        return logits.scatter(-1, following.unsqueeze(-1), 5.0)


class NextIsFirstOfWindow(nn.Module):
    """Every position predicts the window's first token: shows which tokens the model was fed."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros((*tokens.shape, VOCAB))
        first = tokens[:, :1].expand_as(tokens)
        return logits.scatter(-1, first.unsqueeze(-1), 5.0)


class FixedLogits(nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*tokens.shape, -1)


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_greedy_follows_the_argmax_from_the_last_real_position() -> None:
    generated = sample_continuation(
        NextIsPlusOne(), [3], max_tokens=5, context=8, ends=NO_ENDS, choice=GREEDY, generator=_generator()
    )
    assert generated == [4, 5, 6, 7, 8]  # read at a padding position, it would predict the pad id and stop


def test_the_context_window_keeps_the_last_tokens() -> None:
    generated = sample_continuation(
        NextIsFirstOfWindow(), [5, 6, 7, 8], max_tokens=4, context=3, ends=NO_ENDS, choice=GREEDY, generator=None
    )
    # windows: [6 7 8] → 6, [7 8 6] → 7, [8 6 7] → 8, [6 7 8] → 6; the prompt's 5 has left the window
    assert generated == [6, 7, 8, 6]


def test_an_end_token_stops_and_is_not_returned() -> None:
    ends = EndsAndPad(pad_id=PAD, stop_ids=frozenset({6}))
    generated = sample_continuation(
        NextIsPlusOne(), [3], max_tokens=50, context=8, ends=ends, choice=GREEDY, generator=None
    )
    assert generated == [4, 5]


def test_the_pad_id_ends_the_text_like_eos() -> None:
    logits = torch.zeros(VOCAB)
    logits[PAD] = 9.0
    generated = sample_continuation(
        FixedLogits(logits), [1, 2], max_tokens=10, context=4, ends=NO_ENDS, choice=GREEDY, generator=None
    )
    assert generated == []


@settings(max_examples=40, deadline=None, database=None)
@given(
    logits=st.lists(st.floats(-5, 5), min_size=VOCAB - 1, max_size=VOCAB - 1, unique=True),
    k=st.integers(1, VOCAB - 1),
    temperature=st.floats(0.05, 2.0),
    seed=st.integers(0, 2**32),
)
def test_top_k_samples_only_among_the_k_most_likely(logits: list[float], k: int, temperature: float, seed: int) -> None:
    full = torch.tensor([*logits, -1e9])  # the pad id is never likely
    generated = sample_continuation(
        FixedLogits(full),
        [0],
        max_tokens=8,
        context=4,
        ends=NO_ENDS,
        choice=SamplingChoice(temperature=temperature, top_k=k),
        generator=torch.Generator().manual_seed(seed),
    )
    kth = torch.topk(full, k).values[-1]  # tokens tied with the k-th most likely stay allowed
    assert len(generated) == 8 and all(full[token] >= kth for token in generated)
    if k == 1:
        assert all(full[token] == full.max() for token in generated)


def test_an_empty_prompt_is_refused() -> None:
    try:
        sample_continuation(NextIsPlusOne(), [], max_tokens=1, context=4, ends=NO_ENDS, choice=GREEDY, generator=None)
    except ValueError as exc:
        assert "no token" in str(exc)
    else:
        raise AssertionError("an empty prompt must be refused")


def _saved_byte_lm(tmp_path: Path, *, favourite: int) -> Path:
    """A real transformer-lm on the byte tokenizer whose head always prefers ``favourite``."""
    params = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": byte.VOCAB_SIZE, "pad_id": byte.PAD_ID}
    model = build_model("transformer-lm", params, input_shape=(6,), n_outputs=byte.VOCAB_SIZE)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[favourite] = 20.0
    path = tmp_path / "lm.safetensors"
    config = {
        "format_version": 1,
        "model": {"name": "transformer-lm", "params": params},
        "input_shape": [6],
        "n_outputs": byte.VOCAB_SIZE,
        "task": "language-model",
    }
    save_model(path, model, config=config)
    return path


def _ask(path: Path, **overrides: object) -> dict[str, object]:
    request: dict[str, object] = {
        "model_path": str(path),
        "tokenizer": {"kind": "byte"},
        "prompt": "hello, world",
        "max_tokens": 4,
        "temperature": 0.0,
        "top_k": None,
        **overrides,
    }
    before = torch.get_num_threads()
    try:
        return answer(request)
    finally:
        torch.set_num_threads(before)


def test_the_child_decodes_invalid_utf8_with_replacement_characters(tmp_path: Path) -> None:
    # 0xFF never occurs in UTF-8: each generated byte decodes as U+FFFD
    assert _ask(_saved_byte_lm(tmp_path, favourite=0xFF)) == {"text": "\ufffd" * 4, "tokens_generated": 4}
    assert byte.ByteTokenizer().decode([0xE2, 0x98]) == "\ufffd"  # a character cut short


def test_the_child_stops_at_the_byte_eos(tmp_path: Path) -> None:
    assert _ask(_saved_byte_lm(tmp_path, favourite=byte.EOS_ID)) == {"text": "", "tokens_generated": 0}


def test_the_child_samples_with_temperature_and_top_k(tmp_path: Path) -> None:
    found = _ask(_saved_byte_lm(tmp_path, favourite=ord("z")), temperature=1.5, top_k=1, max_tokens=3)
    assert found == {"text": "zzz", "tokens_generated": 3}


def _word_tokenizer(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "a": 1, "fine": 2, "film": 3, "<eos>": 4, "[PAD]": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer.to_str(), encoding="utf-8")
    return path


def _saved_word_lm(tmp_path: Path, *, favourite: int) -> Path:
    params = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": 6, "pad_id": 5}
    model = build_model("transformer-lm", params, input_shape=(4,), n_outputs=6)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[favourite] = 20.0
    path = tmp_path / "words.safetensors"
    config = {
        "format_version": 1,
        "model": {"name": "transformer-lm", "params": params},
        "input_shape": [4],
        "n_outputs": 6,
        "task": "language-model",
    }
    save_model(path, model, config=config)
    return path


def test_the_child_uses_an_uploaded_tokenizer_and_its_eos(tmp_path: Path) -> None:
    words = {"kind": "hugging-face", "path": str(_word_tokenizer(tmp_path)), "pad_id": 5}
    found = _ask(_saved_word_lm(tmp_path, favourite=3), tokenizer=words, prompt="a fine", max_tokens=3)
    assert found == {"text": "film film film", "tokens_generated": 3}
    assert _ask(_saved_word_lm(tmp_path, favourite=4), tokenizer=words, prompt="a fine") == {
        "text": "",
        "tokens_generated": 0,
    }
    assert "no token" in str(_ask(_saved_word_lm(tmp_path, favourite=3), tokenizer=words, prompt="   ")["error"])
