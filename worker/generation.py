"""Sample a continuation of a prompt from a released language model: the child process behind
``POST /v1/jobs/{id}/generate`` (``python -m worker.generation``).

The API (torch-free) feeds one JSON request on stdin: {"model_path", "tokenizer", "prompt",
"max_tokens", "temperature", "top_k", "limits"}, and reads one JSON answer from stdout:
{"text", "tokens_generated"}, {"error": ...} for a request the model cannot serve, or
{"unavailable": ...} where torch is not installed. The child applies ``limits`` ({"cpu_s",
"address_space_bytes"}) to itself before importing torch, so the parent needs no ``preexec_fn``
(unsafe in a threaded server).

The context window of a zoo language model is its ``max_length`` (the dataset's): the last
``max_length`` tokens of prompt and continuation are fed, right-padded, and the logits at the last
real position give the next token. An `hf` language model generates with the Transformers model's
own ``generate`` (its key-value cache), within its positions. Generation stops at ``max_tokens``,
or at an end-of-text token (eos, or the pad id: the training rows end in padding).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kernel.tokenizers import byte
from kernel.tokenizers.base import TextTokenizer

__all__ = ["EndsAndPad", "SamplingChoice", "generate_with_transformers", "main", "sample_continuation"]

EOS_NAMES: Final = ("<eos>", "</s>", "<|endoftext|>", "<|eos|>", "[EOS]", "[SEP]")
"""Tokens of an uploaded tokenizer.json taken for end-of-text."""
MAX_TEXT_CHARS: Final = 200_000
"""The decoded continuation is cut here (a pathological tokenizer's tokens could be long)."""


@dataclass(frozen=True)
class SamplingChoice:
    """``temperature`` 0 picks the most likely token (greedy); ``top_k`` keeps the k most likely."""

    temperature: float
    top_k: int | None


@dataclass(frozen=True)
class EndsAndPad:
    """The id the window is right-padded with, and the ids that end the text (the pad id ends it too)."""

    pad_id: int
    stop_ids: frozenset[int]


@dataclass(frozen=True)
class SamplingTokenizer:
    """The dataset's tokenizer (to encode the prompt and decode the continuation) and its end ids."""

    tokenizer: TextTokenizer
    ends: EndsAndPad


TokenizerLoader = Callable[[Mapping[str, Any]], SamplingTokenizer]
TOKENIZER_LOADERS: dict[str, TokenizerLoader] = {}


def tokenizer_loader(kind: str) -> Callable[[TokenizerLoader], TokenizerLoader]:
    """Register how a request's ``tokenizer.kind`` is loaded (the API names the kind)."""

    def register(loader: TokenizerLoader) -> TokenizerLoader:
        TOKENIZER_LOADERS[kind] = loader
        return loader

    return register


@tokenizer_loader("byte")
def _byte(_request: Mapping[str, Any]) -> SamplingTokenizer:
    return SamplingTokenizer(
        tokenizer=byte.ByteTokenizer(), ends=EndsAndPad(pad_id=byte.PAD_ID, stop_ids=frozenset({byte.EOS_ID}))
    )


@tokenizer_loader("hugging-face")
def _hugging_face(request: Mapping[str, Any]) -> SamplingTokenizer:
    # heavy: the Hugging Face tokenizers library loads only after the limits are in place, where it is used
    from tokenizers import Tokenizer

    from kernel.tokenizers.hugging_face import HuggingFaceTokenizer

    raw = Tokenizer.from_str(Path(str(request["path"])).read_text(encoding="utf-8"))
    eos = {int(found) for name in EOS_NAMES if (found := raw.token_to_id(name)) is not None}
    pad_id = int(request["pad_id"])
    return SamplingTokenizer(
        tokenizer=HuggingFaceTokenizer(raw, pad_id=pad_id), ends=EndsAndPad(pad_id=pad_id, stop_ids=frozenset(eos))
    )


def sample_continuation(
    model: Any,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    context: int,
    ends: EndsAndPad,
    choice: SamplingChoice,
    generator: Any,
) -> list[int]:
    """Up to ``max_tokens`` ids continuing ``prompt_ids``; an end token stops (and is not returned).

    ``model`` maps int64 ids (1, context), right-padded with ``ends.pad_id``, to logits
    (1, context, vocab); ``generator`` is a ``torch.Generator`` (unused when greedy)."""
    import torch

    if not prompt_ids:
        raise ValueError("the prompt encodes to no token")
    tokens = list(prompt_ids)
    generated: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            window = tokens[-context:]
            batch = torch.full((1, context), ends.pad_id, dtype=torch.int64)
            batch[0, : len(window)] = torch.tensor(window, dtype=torch.int64)
            logits = model(batch)[0, len(window) - 1].float()
            token = _pick(logits, choice=choice, generator=generator)
            if token in ends.stop_ids or token == ends.pad_id:
                break
            tokens.append(token)
            generated.append(token)
    return generated


def generate_with_transformers(
    model: Any, prompt_ids: Sequence[int], *, max_tokens: int, ends: EndsAndPad, choice: SamplingChoice, seed: int
) -> list[int]:
    """Up to ``max_tokens`` ids continuing ``prompt_ids`` from an `hf` language model, by the
    Transformers model's own ``generate`` (its cache, its sampling): greedy at temperature 0, else
    sampling at ``temperature`` among the ``top_k`` most likely. The prompt keeps its last tokens
    so that prompt and continuation fit the model's positions; an end token stops (not returned)."""
    import torch

    if not prompt_ids:
        raise ValueError("the prompt encodes to no token")
    inner = model.model  # the Transformers model inside the zoo's HFModel wrapper
    positions = int(getattr(inner.config, "n_positions", None) or inner.config.max_position_embeddings)
    room = positions - max_tokens
    if room < 1:
        raise ValueError(f"max_tokens {max_tokens} leaves no room for a prompt in the model's {positions} positions")
    ids = torch.tensor([list(prompt_ids)[-room:]], dtype=torch.int64)
    stop = sorted(ends.stop_ids | {ends.pad_id})
    sampling: dict[str, Any] = {"do_sample": False}
    if choice.temperature > 0:
        sampling = {"do_sample": True, "temperature": choice.temperature, "top_k": choice.top_k or 0}
    torch.manual_seed(seed)  # post-processing of a released model: protects no privacy (see answer)
    with torch.inference_mode():
        out = inner.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            pad_token_id=ends.pad_id,
            eos_token_id=stop,
            **sampling,
        )
    generated = [int(token) for token in out[0, ids.shape[1] :].tolist()]
    for index, token in enumerate(generated):
        if token in stop:
            return generated[:index]
    return generated


def _pick(logits: Any, *, choice: SamplingChoice, generator: Any) -> int:
    import torch

    if choice.temperature == 0:
        return int(torch.argmax(logits).item())
    scaled = logits / choice.temperature
    if choice.top_k is not None and choice.top_k < scaled.numel():
        kth = torch.topk(scaled, choice.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probabilities = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator).item())


def _limit_self(limits: Mapping[str, Any]) -> None:
    if "cpu_s" in limits:
        cpu = int(limits["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if "address_space_bytes" in limits:
        space = int(limits["address_space_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (space, space))


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON answer to one request (torch imported here, after the limits are in place)."""
    # torch is optional (the worker extra) and heavy: it loads only after the limits are in place
    import torch

    from privtrain_common.model_files import load_model

    torch.set_num_threads(1)  # one request must not take every core of the API host
    try:
        model, config = load_model(Path(str(request["model_path"])))
    except (OSError, ValueError) as exc:
        return {"error": f"the model file cannot be loaded: {exc}"}
    if config.get("task") != "language-model":
        return {"error": f"the model is a {config.get('task')} model, not a language model"}
    input_shape = config["input_shape"]
    assert isinstance(input_shape, list)
    tokenizer_request = request["tokenizer"]
    loaded = TOKENIZER_LOADERS[str(tokenizer_request["kind"])](tokenizer_request)
    prompt_ids = loaded.tokenizer.encode_batch([str(request["prompt"])])[0]
    if not prompt_ids:
        return {"error": "the prompt encodes to no token with this model's tokenizer"}
    top_k = request.get("top_k")
    # Sampling from a released model is post-processing: it protects no privacy, so a torch
    # generator seeded from the OS suffices (privacy-protecting draws use SecureRandom, not this).
    seed = int.from_bytes(os.urandom(8), "little")
    choice = SamplingChoice(temperature=float(request["temperature"]), top_k=None if top_k is None else int(top_k))
    max_tokens = int(request["max_tokens"])
    described = config.get("model")
    if isinstance(described, dict) and described.get("name") == "hf":  # a Transformers model: its own generate
        try:
            generated = generate_with_transformers(
                model, prompt_ids, max_tokens=max_tokens, ends=loaded.ends, choice=choice, seed=seed
            )
        except ValueError as exc:
            return {"error": str(exc)}
    else:
        generated = sample_continuation(
            model,
            prompt_ids,
            max_tokens=max_tokens,
            context=int(input_shape[0]),
            ends=loaded.ends,
            choice=choice,
            generator=torch.Generator().manual_seed(seed),
        )
    text = loaded.tokenizer.decode(generated)[:MAX_TEXT_CHARS]
    return {"text": text, "tokens_generated": len(generated)}


def main() -> None:
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _limit_self(request.get("limits") or {})
    try:
        import torch  # noqa: F401  (a deployment without it cannot run models: say so)
    except ImportError:
        json.dump({"unavailable": "torch is not installed where the API runs"}, sys.stdout)
        return
    json.dump(answer(request), sys.stdout)


if __name__ == "__main__":
    main()
