"""A tuning's trials on the worker: how many, and which configuration each runs.

The number of trials K is drawn by the worker that opens the tuning, from the OS's CSPRNG, once
per attempt, from the tuning's distribution conditioned on K <= its public maximum. Papernot and
Steinke's guarantee holds for the best trial only while K stays secret: it is logged nowhere and
lives only in the service's trial queue while the tuning runs (kernel/tuning/trial_queue.py, deleted
when it settles), and the tuning runs in exactly ``maximum`` slots whatever K is
(kernel/tuning/slots.py). Each trial picks one configuration of the public pool uniformly at random,
independently of the data and of the other trials.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from kernel import privacy
from kernel.privacy import TrialDistribution
from kernel.tuning.planning import RebuiltCandidate

__all__ = ["TuningClaim", "trial_count"]


@dataclass(frozen=True)
class TuningClaim:
    """An admitted tuning as the worker re-derived it (every candidate checked against the charge)."""

    distribution: TrialDistribution
    candidates: tuple[RebuiltCandidate, ...]
    metric: str

    def draw_candidate(self, rng: secrets.SystemRandom) -> int:
        return rng.randrange(len(self.candidates))


def trial_count(distribution: TrialDistribution, rng: secrets.SystemRandom) -> int:
    """K, drawn from the OS's CSPRNG (never from anything the client sent)."""
    return privacy.sample_trial_count(distribution, rng=rng)
