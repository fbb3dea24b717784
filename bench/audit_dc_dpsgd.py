"""One-run privacy audit of DC-DPSGD: the published code's noise against the service's
(docs/reproductions.md#one-run-privacy-audit-of-dc-dpsgd).

For each claimed ε, one step (q = 1) of each configuration is audited with gradient canaries
(worker.auditing; Steinke, Nasr, Jagielski 2023):

- ``code-compat (UNSAFE)``: the RANK rule with the published code's noise formula (table N1) and
  its calibration: σ from Opacus' RDP accountant at ε/2 (the code splits ε between traces and
  gradient), noise σ·√((m/B)²c1² + (1 − m/B)²c2²) on the sum;
- ``rank`` and ``threshold``: the service's mechanisms, σ calibrated by the service at the full ε,
  noise σ·Δ with Δ = 2c1 − c2 and c1.

A lower bound above the claimed ε proves that claim false. With δ = 1e-5 the bound a run can
certify is capped by the number of guesses (all 25 600 of 32 000 canaries guessed right certify
at most ε ≈ 8.02), so the ε = 8 row needs the large design.

    .venv/bin/python -m bench.audit_dc_dpsgd --claimed 2 4 --canaries 4000 --guess-fraction 0.5
    .venv/bin/python -m bench.audit_dc_dpsgd --claimed 8 --canaries 32000 --guess-fraction 0.8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from opacus.accountants.utils import get_noise_multiplier

from algorithms.dc_dpsgd.aggregators import RankAggregator, ThresholdAggregator
from algorithms.dc_dpsgd.projection import StreamingProjection
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from worker.auditing import (
    CanaryDesign,
    audit_one_step,
    code_compat_noise_rule,
    sound_noise_rule,
)

C1, C2, P, DELTA = 1.0, 0.1, 0.1, 1e-5


def code_sigma(claimed: float) -> float:
    """The code's σ: Opacus RDP at ε/2, one step at q = 1 (warnings about α range silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_noise_multiplier(
            target_epsilon=claimed / 2, target_delta=DELTA, sample_rate=1.0, steps=1, accountant="rdp"
        )


def service_sigma(claimed: float) -> float:
    return privacy.calibrate_noise_multiplier(
        lambda s: privacy.GaussianEvent(noise_multiplier=s, count=1),
        target_epsilon=claimed,
        delta=DELTA,
    )


def audit_rows(*, claimed: float, canaries: int, guess_fraction: float, seed: int) -> list[dict]:
    # Included canaries ≈ m/2 (sd √m/2); ⌊p·|S|⌋ must exceed them, so |S| ≥ 10·(m/2 + 5 sd).
    fillers = int((canaries / 2 + 5 * canaries**0.5 / 2) / P) - canaries // 2
    design = CanaryDesign(canaries=canaries, fillers=fillers)
    projection = StreamingProjection(k=200, theta=2.0, scope=("marker.weight",))
    rank = RankAggregator(c1=C1, c2=C2, projection=projection, p=P)
    threshold = ThresholdAggregator(c1=C1, c2=C2, projection=projection, tau=0.05)
    sigma_code, sigma_sound = code_sigma(claimed), service_sigma(claimed)
    cases = (
        (
            "code-compat (UNSAFE)",
            rank,
            code_compat_noise_rule(noise_multiplier=sigma_code, c1=C1, c2=C2, p=P),
            sigma_code,
        ),
        ("rank", rank, sound_noise_rule(rank, sigma_sound), sigma_sound),
        ("threshold", threshold, sound_noise_rule(threshold, sigma_sound), sigma_sound),
    )
    rows = []
    for name, aggregator, noise, sigma in cases:
        started = time.perf_counter()
        result = audit_one_step(
            design=design,
            aggregator=aggregator,
            noise=noise,
            delta=DELTA,
            guess_fraction=guess_fraction,
            generator=SecureRandom.from_seed(seed),
        )
        rows.append(
            {
                "claimed_epsilon": claimed,
                "configuration": name,
                "sigma": round(sigma, 4),
                "canaries": result.canaries,
                "guesses": result.guesses,
                "correct": result.correct,
                "epsilon_lower_bound": round(result.epsilon_lower_bound, 3),
                "violation": result.epsilon_lower_bound > claimed,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claimed", type=float, nargs="+", default=[2.0, 4.0])
    parser.add_argument("--canaries", type=int, default=4000)
    parser.add_argument("--guess-fraction", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("| claimed ε | configuration | σ | canaries | guesses | correct | ε lower bound (95%) | violation |")
    print("|---|---|---|---|---|---|---|---|")
    for claimed in args.claimed:
        for row in audit_rows(
            claimed=claimed, canaries=args.canaries, guess_fraction=args.guess_fraction, seed=args.seed
        ):
            print(
                f"| {row['claimed_epsilon']:g} | {row['configuration']} | {row['sigma']} | "
                f"{row['canaries']} | {row['guesses']} | {row['correct']} | "
                f"{row['epsilon_lower_bound']} | {'**yes**' if row['violation'] else 'no'} |"
            )
            print(json.dumps(row), flush=True, file=sys.stderr)


if __name__ == "__main__":
    main()
