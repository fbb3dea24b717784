"""Timing in one run: interleave the variants, so a noisy machine slows them all alike (ratios)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def interleaved_medians(
    runs: Mapping[str, Callable[[int], None]], *, per_sample: int, repeats: int
) -> dict[str, float]:
    """Median seconds per unit; every repeat times every variant once, in turn (after a warm-up)."""
    for run in runs.values():
        run(2)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run(per_sample)
            samples[name].append((time.perf_counter() - start) / per_sample)
    return {name: statistics.median(values) for name, values in samples.items()}
