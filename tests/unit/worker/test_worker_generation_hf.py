"""Generation from an `hf` language model with the Transformers model's own ``generate``: greedy
equals the argmax loop over the service's own forward; sampling is reproducible given its seed;
the prompt keeps its last tokens so that the continuation fits the positions."""

from __future__ import annotations

import pytest
import torch

from tests.unit.worker.hf_fixtures import hf_model
from tests.unit.worker.text_fixtures import PAD
from worker.generation import EndsAndPad, SamplingChoice, generate_with_transformers

ENDS = EndsAndPad(pad_id=PAD, stop_ids=frozenset())
PROMPT = [5, 9, 3, 7]


def _greedy_by_forward(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(torch.tensor([tokens]))[0, -1].argmax())
            if token == PAD:
                break
            tokens.append(token)
            out.append(token)
    return out


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_greedy_generate_equals_the_argmax_loop_over_the_services_forward(model_type: str) -> None:
    model = hf_model(model_type, "causal-lm").eval()
    got = generate_with_transformers(
        model, PROMPT, max_tokens=5, ends=ENDS, choice=SamplingChoice(temperature=0.0, top_k=None), seed=1
    )
    assert got == _greedy_by_forward(model, PROMPT, 5)


def test_sampling_is_reproducible_from_its_seed_and_the_prompt_is_cut_to_fit() -> None:
    model = hf_model("gpt2", "causal-lm").eval()
    choice = SamplingChoice(temperature=1.0, top_k=4)
    first = generate_with_transformers(model, PROMPT * 10, max_tokens=6, ends=ENDS, choice=choice, seed=7)
    again = generate_with_transformers(model, PROMPT * 10, max_tokens=6, ends=ENDS, choice=choice, seed=7)
    assert first == again and len(first) <= 6  # 40 prompt tokens cut to the 16 positions' last 10
    with pytest.raises(ValueError, match="no room for a prompt"):
        generate_with_transformers(model, PROMPT, max_tokens=16, ends=ENDS, choice=choice, seed=7)
