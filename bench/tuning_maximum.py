"""What a public maximum of K costs a tuning: its ledger ε by distribution and maximum.

A tuning runs in one slot per possible trial (docs/tuning.md#slots-why-k-stays-secret), so its
maximum sets its worker time; conditioning K on it adds a surcharge to the charge
(docs/privacy-model.md#tuning). This prints, for one trial event, the tuning's ledger ε with no
maximum, at multiples of E[K], and at the service's default maximum, each distribution fitted so
that the conditioned E[K] is the one asked for. Pure computation: no data, no worker.

    .venv/bin/python -m bench.tuning_maximum --means 3 8
"""

from __future__ import annotations

import argparse

from kernel.privacy import ledger_epsilon, rdp_curve, tuned_curve
from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.events import PoissonSampledGaussianEvent, PoissonTrials
from kernel.privacy.tuning import bounded_for_mean, truncated_negative_binomial_for_mean

DELTA = 1e-5
TRIAL = PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=1.1, count=1000)
KINDS = (
    ("logarithmic (η = 0)", "truncated-negative-binomial", 0.0),
    ("geometric (η = 1)", "truncated-negative-binomial", 1.0),
    ("poisson", "poisson", 0.0),
)


def _epsilon(curve: tuple[float, ...]) -> float:
    return ledger_epsilon(curve, DELTA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--means", type=float, nargs="+", default=[3.0, 8.0])
    parser.add_argument("--multiples", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--cap", type=int, default=100, help="PRIVTRAIN_TUNING_MAX_TRIALS")
    args = parser.parse_args()
    trial = rdp_curve(TRIAL)
    print(f"one trial: ε {_epsilon(trial):.2f} at δ {DELTA:g}")
    header = " | ".join(f"maximum {m}·E[K]" for m in args.multiples)
    print(f"| E[K] | distribution | no maximum | {header} | default maximum |")
    print("|---:|---|---:|" + "---:|" * len(args.multiples) + "---|")
    for mean in args.means:
        for label, kind, eta in KINDS:
            unbounded = (
                PoissonTrials(mean=mean) if kind == "poisson" else truncated_negative_binomial_for_mean(mean, eta)
            )
            cells = [f"{_epsilon(tuned_curve(unbounded, trial)):.2f}"]
            for multiple in args.multiples:
                maximum = round(multiple * mean)
                try:
                    bounded = bounded_for_mean(kind, mean=mean, maximum=maximum, cap=10_000, eta=eta)
                    cells.append(f"{_epsilon(tuned_curve(bounded, trial)):.2f}")
                except PrivacyEventError:
                    cells.append("—")
            default = bounded_for_mean(kind, mean=mean, maximum=None, cap=args.cap, eta=eta)
            cells.append(f"{_epsilon(tuned_curve(default, trial)):.2f} at {default.maximum}")
            print(f"| {mean:g} | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
