"""A one-run audit catches the published code's noise and passes the service's."""

from __future__ import annotations

import pytest
import torch

from bench.audit_dc_dpsgd import audit_rows
from worker.auditing import code_compat_noise_std, count_correct_guesses


def test_code_compat_noise_is_table_n1() -> None:
    """B = 256, m = 25, c1 = 10·c2: ≈ 0.133·c1·σ on the sum, against σ·c1 (threshold) and
    1.9·c1·σ (rank) that the sound calibration adds."""
    std = code_compat_noise_std(noise_multiplier=1.0, c1=1.0, c2=0.1, tail=25, batch=256)
    assert std == pytest.approx(0.1334, abs=5e-4)
    assert code_compat_noise_std(noise_multiplier=2.0, c1=1.0, c2=0.1, tail=25, batch=256) == pytest.approx(2 * std)


def test_guesses_take_the_extremes_of_the_scores() -> None:
    scores = torch.tensor([5.0, -3.0, 0.1, 4.0, -2.0, 0.0])
    included = torch.tensor([True, False, True, False, True, False])
    # in: scores 5.0 (right), 4.0 (wrong); out: -3.0 (right), -2.0 (wrong)
    assert count_correct_guesses(scores, included, guesses=4) == 2
    assert count_correct_guesses(scores, included, guesses=2) == 2
    with pytest.raises(ValueError):
        count_correct_guesses(scores, included, guesses=3)


@pytest.mark.parametrize("claimed", [4.0])
def test_the_audit_flags_the_code_and_not_the_service(claimed: float) -> None:
    rows = {row["configuration"]: row for row in audit_rows(claimed=claimed, canaries=4000, guess_fraction=0.5, seed=1)}
    unsafe = rows["code-compat (UNSAFE)"]
    assert unsafe["violation"] and unsafe["epsilon_lower_bound"] > claimed + 1.0
    for sound in ("rank", "threshold"):
        assert not rows[sound]["violation"]
        assert rows[sound]["epsilon_lower_bound"] < claimed / 2
