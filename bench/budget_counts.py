"""How many jobs of a given target ε fit into a dataset budget ε_G, against naive ε addition.

Uses the service's own calibration and Rényi filter (kernel.privacy), so the counts are exactly what
the ledger would admit for identical DP-SGD jobs submitted one after another.

    .venv/bin/python -m bench.budget_counts
"""

from __future__ import annotations

import math

from kernel import privacy

SETTINGS = {
    "digits walkthrough (n=1437, B=128, 20 epochs: q=0.089, T=225)": (128 / 1437, 225),
    "MNIST-like (n=60000, B=256, 3 epochs: q=0.0043, T=704)": (256 / 60000, 704),
    "small data, full batch (q=1, T=100)": (1.0, 100),
}


def jobs_that_fit(*, q: float, steps: int, target: float, budget: float, delta: float) -> int:
    def event(sigma: float) -> privacy.PrivacyEvent:
        if q >= 1:
            return privacy.GaussianEvent(noise_multiplier=sigma, count=steps)
        return privacy.PoissonSampledGaussianEvent(sampling_probability=q, noise_multiplier=sigma, count=steps)

    sigma = privacy.calibrate_noise_multiplier(event, target_epsilon=target, delta=delta)
    cost = privacy.rdp_curve(event(sigma))
    capacity = privacy.capacity_curve(budget, delta)
    used = tuple(0.0 for _ in privacy.ORDERS)
    zeros = used
    count = 0
    while privacy.admission_order(committed=used, reserved=zeros, cost=cost, capacity=capacity) is not None:
        used = privacy.add_curves(used, cost)
        count += 1
    return count


def main() -> None:
    budget, delta = 8.0, 1e-5
    print(f"jobs admitted into a fresh dataset with ε_G = {budget}, δ = {delta}")
    print("| setting | target ε 1 | target ε 2 | target ε 4 | target ε 8 |")
    print("|---|---|---|---|---|")
    for name, (q, steps) in SETTINGS.items():
        counts = [jobs_that_fit(q=q, steps=steps, target=t, budget=budget, delta=delta) for t in (1, 2, 4, 8)]
        print(f"| {name} | " + " | ".join(str(c) for c in counts) + " |")
    naive = [math.floor(budget / t) for t in (1, 2, 4, 8)]
    print("| naive addition of ε | " + " | ".join(str(c) for c in naive) + " |")


if __name__ == "__main__":
    main()
