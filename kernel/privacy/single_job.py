"""The tightest valid ε of ONE job at δ, for the report: the minimum over several valid methods.

The ledger charges RDP because RDP composes into a valid filter over adaptively
chosen jobs; the numbers below are valid for a single job only and never touch the ledger. Each
method is a true upper bound on its own, so the answer is the minimum over the methods that
succeeded, and the one that won is named. A method that raises or returns a non-finite value is
skipped (never read as "small"); the ledger's own RDP number is always a candidate, so there is
always an answer and it is never larger than the ledger's. See docs/single-job-epsilon.md.

Methods (slugs in :data:`METHODS`):

* ``gaussian-dp`` — every leaf a Gaussian (``GaussianEvent``, q = 1 ``PoissonSampledGaussianEvent``,
  and ``ZCDPEvent`` when the algorithm declares its zCDP leaves to be Gaussian releases): the job
  is μ-GDP with μ² = Σ count/σ² (ZCDP: 2ρ·count), and the exact μ-GDP profile
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Balle & Wang 2018; Dong, Roth & Su 2019) is inverted.
  For a zCDP budget filter whose Gaussians' noise is chosen from earlier releases, fully adaptive
  composition for GDP (Smith & Thakurta 2022) gives the same μ as long as the realised Σμ_i² is at
  most the event's 2ρ·count, which is what the event bounds.
* ``pure-dp-optimal`` — every leaf pure ε0-DP (``PureDPEvent``) or ε0-bounded-range
  (``ExponentialMechanismEvent``; ε0-BR implies ε0-DP) with one common ε0: the exact optimal
  composition of k adaptively chosen ε0-DP mechanisms (Kairouz, Oh & Viswanath 2015), i.e. the
  privacy profile of k-fold randomized response.
* ``prv`` — prv-accountant (Gopi, Lee & Wutschitz 2021) for the other compositions, with Gaussian
  zCDP leaves as Gaussians and bounded-range leaves as pure DP (randomized response dominates
  every ε0-DP mechanism, and dominating pairs compose adaptively: Zhu, Dong & Wang 2022).
* ``pld`` — dp-accounting's pessimistic privacy-loss distributions (Meiser & Mohammadi 2018;
  Koskela, Jälkö & Honkela 2020; Doroshenko et al. 2022) for the same leaves, only when
  prv-accountant fails (e.g. q = 0.1, σ = 0.6, T = 50).
* ``rdp-single-job`` — the event's RDP converted at δ itself (no union bound over the ledger's
  grid) and, when every leaf has a closed-form RDP, at the best real order α > 1 (Canonne,
  Kamath & Steinke 2020, the conversion of :mod:`kernel.privacy.conversion`). For a ZCDPEvent that
  is not declared Gaussian this is the optimal ρ-zCDP → (ε, δ) conversion, which is what holds for
  an arbitrary ρ-zCDP mechanism (its privacy profile is not known beyond its Rényi divergences).
* ``rdp`` — the ledger's own number, ``ledger_epsilon(rdp_curve(event), δ)``.

An event containing hyperparameter tuning (docs/privacy-model.md#tuning) gets only the last two,
with rdp-single-job on the grid orders: its cost is known only as an RDP curve, so neither an
exact profile nor a numeric accountant applies.

Not implemented: the adaptive bounded-range composition bound of Dong, Durfee & Rogers 2020
("Optimal Differential Privacy Composition for Exponential Mechanisms and the Cost of
Adaptivity"). They prove that adaptivity costs more than their non-adaptive optimum, so only
their adaptive bound would be valid here; its exact statement could not be checked against the
paper while writing this module, and a privacy bound is not guessed. Bounded-range leaves are
instead covered by the pure-DP optimum above and by their ε0²/8-zCDP bound (Cesar & Rogers
2021) inside ``rdp-single-job``.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import gammaln, log_ndtr

from kernel.privacy.conversion import epsilon_from_rdp, ledger_epsilon, validate_delta
from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    LeafEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    ZCDPEvent,
    contains_tuning,
    iter_leaves,
)
from kernel.privacy.prv import prv_epsilon
from kernel.privacy.ranges import DELTA_MIN
from kernel.privacy.rdp import rdp_curve
from kernel.privacy.rounding import round_up, round_up_sum

METHODS: Final[tuple[str, ...]] = ("gaussian-dp", "pure-dp-optimal", "prv", "pld", "rdp-single-job", "rdp")

LOG_DELTA_MARGIN: Final[float] = 1e-6
"""A root ε is accepted only where the computed log δ(ε) is this far below log δ: it dominates the
float error of the log-space profiles (~1e-9 in log δ even at k = 10^5) by three orders, so the
root finder's tolerance can never land on the invalid side."""

PLD_MAX_BUCKETS: Final[float] = 3e5
"""The PLD fallback's discretisation: interval h = max(1e-4, (estimated loss range)/PLD_MAX_BUCKETS),
so the whole computation stays under ~1 s (measured ≤ 0.8 s, ≤ 250 MB) for counts up to 10^5.
A coarser h only makes the pessimistic PLD looser (every loss is rounded up), never invalid."""

NUMERIC_MAX_EPSILON: Final[float] = 32.0
"""prv-accountant and the PLD are run only when a cheap RDP bound is at most this: their grids
grow with ε (measured 5-50 s per call for ε ≈ 40-300), and beyond it no ε means anything."""

_MAX_ORDER: Final[float] = 1e7

PURE_DP_MAX_COUNT: Final[int] = 200_000
"""pure-dp-optimal sums k + 1 binomial terms per bisection step (~200 steps): above this count it
is skipped (rdp-single-job still bounds the job), so its time and memory stay bounded."""

NUMERIC_TIMEOUT_S: Final[float] = 120.0
"""Wall-clock cap of the numeric accountants in :func:`capped_single_job_epsilon`."""

NUMERIC_MEMORY_BYTES: Final[int] = 16 * 2**30
"""Address-space cap of the child process that runs them (σ = 0.01 once needed 23 GB)."""


@dataclass(frozen=True)
class SingleJobEpsilon:
    """A valid upper bound on one job's ε at δ, the method that gave it, and a report label."""

    epsilon: float
    method: str
    detail: str


# ----------------------------------------------------------------------------- entry point


@lru_cache(maxsize=512)
def single_job_epsilon(
    event: PrivacyEvent,
    delta: float,
    *,
    zcdp_is_gaussian: bool,
    numeric: bool,
) -> SingleJobEpsilon:
    """The minimum over the valid methods that succeeded; the ledger's RDP number at worst.

    ``numeric=False`` runs the closed forms only (gaussian-dp, pure-dp-optimal, rdp-single-job,
    rdp): bounded time and memory, for the request path. ``numeric=True`` adds prv-accountant /
    PLD, whose cost is not bounded: call it off the request path, under :func:`capped_single_job_epsilon`.
    """
    delta = validate_delta(delta)
    if contains_tuning(event):
        return _rdp_only(event, delta)
    leaves = _aggregate(iter_leaves(event))
    candidates, exact = _closed_forms(event, leaves, delta, zcdp_is_gaussian=zcdp_is_gaussian)
    if numeric and _numeric_applies(leaves, candidates, delta, exact=exact, zcdp_is_gaussian=zcdp_is_gaussian):
        dominating = _dominating_event(leaves)
        if not _attempt(candidates, "prv", _PRV_LABEL, lambda: prv_epsilon(dominating, delta)):
            _attempt(candidates, "pld", _PLD_LABEL, lambda: pld_epsilon(dominating, delta))
    return min(candidates, key=lambda c: c.epsilon)


def _closed_forms(
    event: PrivacyEvent,
    leaves: tuple[LeafEvent, ...],
    delta: float,
    *,
    zcdp_is_gaussian: bool,
) -> tuple[list[SingleJobEpsilon], bool]:
    """The closed-form candidates, and whether an exact profile (gaussian-dp, pure-dp-optimal)
    was among them: then no numeric accountant can do better."""
    candidates: list[SingleJobEpsilon] = []
    exact = False
    if leaves and _all_gaussian(leaves, zcdp_is_gaussian=zcdp_is_gaussian):
        exact = _attempt(
            candidates, "gaussian-dp", _GAUSSIAN_DP_LABEL, lambda: gaussian_dp_epsilon(mu=_gdp_mu(leaves), delta=delta)
        )
    elif (
        leaves
        and (eps0 := _common_pure_epsilon(leaves)) is not None
        and (count := _pure_count(leaves)) <= PURE_DP_MAX_COUNT
    ):
        exact = _attempt(
            candidates,
            "pure-dp-optimal",
            _PURE_DP_LABEL,
            lambda: pure_dp_composition_epsilon(epsilon0=eps0, count=count, delta=delta),
        )
    _attempt(candidates, "rdp-single-job", _rdp_single_job_label(leaves), lambda: rdp_single_job_epsilon(event, delta))
    candidates.append(SingleJobEpsilon(ledger_epsilon(rdp_curve(event), delta), "rdp", _RDP_LABEL))
    return candidates, exact


def _rdp_only(event: PrivacyEvent, delta: float) -> SingleJobEpsilon:
    """The RDP conversions alone, for an event whose cost is known only as an RDP curve (tuning)."""
    candidates: list[SingleJobEpsilon] = []
    _attempt(candidates, "rdp-single-job", _rdp_single_job_label(()), lambda: rdp_single_job_epsilon(event, delta))
    candidates.append(SingleJobEpsilon(ledger_epsilon(rdp_curve(event), delta), "rdp", _RDP_LABEL))
    return min(candidates, key=lambda c: c.epsilon)


def _numeric_applies(
    leaves: tuple[LeafEvent, ...],
    candidates: list[SingleJobEpsilon],
    delta: float,
    *,
    exact: bool,
    zcdp_is_gaussian: bool,
) -> bool:
    """prv/PLD can only improve on the closed forms for inexact, non-empty events whose cheap
    bound is small enough for their grids (NUMERIC_MAX_EPSILON) and whose leaves they model, at a
    delta inside the validated range (a stored sub-DELTA_MIN delta gets the closed forms only)."""
    cheap_bound = min(c.epsilon for c in candidates)
    return (
        not exact
        and bool(leaves)
        and cheap_bound <= NUMERIC_MAX_EPSILON
        and delta >= DELTA_MIN
        and _numeric_ok(leaves, zcdp_is_gaussian=zcdp_is_gaussian)
    )


def _pure_count(leaves: tuple[LeafEvent, ...]) -> int:
    return sum(leaf.count for leaf in leaves)


# ----------------------------------------------------------------------------- time-capped numeric


def capped_single_job_epsilon(
    event: PrivacyEvent,
    delta: float,
    *,
    zcdp_is_gaussian: bool,
    timeout_s: float | None = None,
) -> SingleJobEpsilon:
    """The numeric single-job ε, run in a child process under a wall-clock and memory cap.

    When the child gives up (deadline, memory, crash) the closed-form answer is returned, its
    detail saying "numeric accountant not available: <reason>". A killed child cannot hold a
    lock or leak memory into the caller, which a thread could."""
    delta = validate_delta(delta)
    if contains_tuning(event):
        return _rdp_only(event, delta)
    leaves = _aggregate(iter_leaves(event))
    candidates, exact = _closed_forms(event, leaves, delta, zcdp_is_gaussian=zcdp_is_gaussian)
    closed = min(candidates, key=lambda c: c.epsilon)
    if not _numeric_applies(leaves, candidates, delta, exact=exact, zcdp_is_gaussian=zcdp_is_gaussian):
        return closed  # nothing for a child process to improve on
    limit = NUMERIC_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return _run_capped(event, delta, zcdp_is_gaussian=zcdp_is_gaussian, timeout_s=limit)
    except _NumericUnavailable as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - e.g. no child process allowed here: the closed form stands
        reason = f"could not start the accountant process ({type(exc).__name__})"
    return replace(closed, detail=f"{closed.detail}; numeric accountant not available: {reason}")


def _accountant_context() -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """Where the capped children come from: never a fork of the caller (a worker holding torch, CUDA
    and database state). A fork server with this module preloaded when the platform has one: it
    starts once per process, clean, and forks each child with the accountants already imported,
    so a child costs milliseconds instead of a fresh interpreter that imports the caller's main
    module and the accountants again (seconds). Spawn where there is no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # The PLD fallback's library too (0.7 s to import): the server pays it once.
    context.set_forkserver_preload([__name__, "dp_accounting.pld.privacy_loss_distribution"])
    return context


def start_accountant_server() -> None:
    """Start the fork server now (a worker calls this at start-up), so the first job's report does
    not wait for it: starting it imports the accountants (about a second)."""
    if isinstance(_accountant_context(), multiprocessing.context.ForkServerContext):
        from multiprocessing import forkserver

        forkserver.ensure_running()


class _NumericUnavailable(Exception):
    """The numeric accountants did not answer in time or within memory."""


def _run_capped(event: PrivacyEvent, delta: float, *, zcdp_is_gaussian: bool, timeout_s: float) -> SingleJobEpsilon:
    if timeout_s <= 0:
        raise _NumericUnavailable("time cap is 0 s")
    context = _accountant_context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_numeric_child, args=(sender, event, delta, zcdp_is_gaussian), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            raise _NumericUnavailable(f"gave up after the {timeout_s:g} s time cap")
        try:
            outcome = receiver.recv()
        except EOFError:
            raise _NumericUnavailable(f"the accountant process died (exit code {child.exitcode})") from None
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if isinstance(outcome, SingleJobEpsilon):
        return outcome
    raise _NumericUnavailable(str(outcome))


def _numeric_child(sender: object, event: PrivacyEvent, delta: float, zcdp_is_gaussian: bool) -> None:
    """Child process body: cap the address space, compute, send the result or the reason."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (NUMERIC_MEMORY_BYTES, NUMERIC_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass  # no cap on this platform; the deadline still holds
    try:
        outcome: object = single_job_epsilon(event, delta, zcdp_is_gaussian=zcdp_is_gaussian, numeric=True)
    except MemoryError:
        outcome = f"over the {NUMERIC_MEMORY_BYTES / 2**30:g} GiB memory cap"
    except Exception as exc:  # noqa: BLE001 - any failure is reported as the reason for the fallback
        outcome = f"{type(exc).__name__}: {exc}"
    sender.send(outcome)  # type: ignore[attr-defined]
    sender.close()  # type: ignore[attr-defined]


_RDP_LABEL: Final[str] = "the ledger's RDP number (no tighter single-job bound applied)"
_PURE_DP_LABEL: Final[str] = (
    "tight single-job upper bound: optimal composition of pure-DP / bounded-range steps "
    "(Kairouz-Oh-Viswanath); not used by the ledger"
)
_GAUSSIAN_DP_LABEL: Final[str] = (
    "exact single-job bound: the job is μ-Gaussian-DP (exact privacy profile); not used by the ledger"
)
_PRV_LABEL: Final[str] = "tight single-job upper bound (prv-accountant); not used by the ledger"
_PLD_LABEL: Final[str] = "tight single-job upper bound (dp-accounting pessimistic PLD); not used by the ledger"


def _rdp_single_job_label(leaves: tuple[LeafEvent, ...]) -> str:
    if leaves and all(isinstance(leaf, ZCDPEvent) for leaf in leaves):
        return "single-job bound: optimal ρ-zCDP conversion at δ over all orders; not used by the ledger"
    return "single-job bound: RDP converted at δ over all orders (no ledger union bound); not used by the ledger"


def _attempt(
    candidates: list[SingleJobEpsilon],
    method: str,
    detail: str,
    compute: Callable[[], float | None],
) -> bool:
    """Run one method; any exception, None, NaN, inf or negative value means it is skipped."""
    try:
        value = compute()
    except Exception:  # noqa: BLE001 - a failed method is skipped, never read as a small number
        return False
    if value is None or not math.isfinite(value) or value < 0.0:
        return False
    candidates.append(SingleJobEpsilon(float(value), method, detail))
    return True


# ----------------------------------------------------------------------------- leaves


def _aggregate(leaves: Iterable[LeafEvent]) -> tuple[LeafEvent, ...]:
    """Leaves with equal one-use mechanisms merged (counts summed); zero counts dropped."""
    counts: dict[LeafEvent, int] = {}
    for leaf in leaves:
        count = leaf.count
        if count > 0:
            one_use = replace(leaf, count=1)
            counts[one_use] = counts.get(one_use, 0) + count
    return tuple(replace(leaf, count=count) for leaf, count in counts.items())


def _is_gaussian(leaf: LeafEvent, *, zcdp_is_gaussian: bool) -> bool:
    if isinstance(leaf, GaussianEvent):
        return True
    if isinstance(leaf, PoissonSampledGaussianEvent):
        return leaf.sampling_probability == 1.0
    return zcdp_is_gaussian and isinstance(leaf, ZCDPEvent)


def _all_gaussian(leaves: tuple[LeafEvent, ...], *, zcdp_is_gaussian: bool) -> bool:
    return all(_is_gaussian(leaf, zcdp_is_gaussian=zcdp_is_gaussian) for leaf in leaves)


def _gdp_mu(leaves: tuple[LeafEvent, ...]) -> float:
    """μ = sqrt(Σ μ_i²): count/σ² per Gaussian leaf, 2ρ·count per (Gaussian) zCDP leaf."""
    squares = []
    for leaf in leaves:
        if isinstance(leaf, ZCDPEvent):
            squares.append(2.0 * leaf.rho * leaf.count)
        else:
            sigma = leaf.noise_multiplier  # type: ignore[union-attr]
            squares.append(leaf.count / (sigma * sigma))
    return math.sqrt(round_up(math.fsum(squares)))


def _common_pure_epsilon(leaves: tuple[LeafEvent, ...]) -> float | None:
    """ε0 when every leaf is ε0-DP (pure DP or ε0-bounded range) with one common ε0."""
    values = set()
    for leaf in leaves:
        if not isinstance(leaf, (PureDPEvent, ExponentialMechanismEvent)):
            return None
        values.add(leaf.epsilon)
    return values.pop() if len(values) == 1 else None


def _numeric_ok(leaves: tuple[LeafEvent, ...], *, zcdp_is_gaussian: bool) -> bool:
    """PRV/PLD need a known privacy-loss distribution: a non-Gaussian zCDP leaf has none."""
    return zcdp_is_gaussian or not any(isinstance(leaf, ZCDPEvent) for leaf in leaves)


def _dominating_event(leaves: tuple[LeafEvent, ...]) -> PrivacyEvent:
    """Leaves rewritten as mechanisms with known PLDs that dominate them: a Gaussian zCDP leaf is a
    Gaussian with σ = 1/sqrt(2ρ) (same μ); an ε0-bounded-range leaf is ε0-DP."""
    rewritten: list[PrivacyEvent] = []
    for leaf in leaves:
        if isinstance(leaf, ZCDPEvent):
            rewritten.append(GaussianEvent(noise_multiplier=1.0 / math.sqrt(2.0 * leaf.rho), count=leaf.count))
        elif isinstance(leaf, ExponentialMechanismEvent):
            rewritten.append(PureDPEvent(epsilon=leaf.epsilon, count=leaf.count))
        else:
            rewritten.append(leaf)
    return ComposedEvent(events=tuple(rewritten))


def _smallest_epsilon(log_delta_at: Callable[[float], float], *, delta: float, upper: float) -> float:
    """The smallest ε in [0, upper] (to ~1e-12) whose computed log δ(ε) is LOG_DELTA_MARGIN below
    log δ; δ(ε) must be non-increasing. Returns the verified end of the bracket, rounded up."""
    target = math.log(delta) - LOG_DELTA_MARGIN
    if log_delta_at(0.0) <= target:
        return 0.0
    if not log_delta_at(upper) <= target:
        raise ArithmeticError("no ε in range meets δ")
    lo, hi = 0.0, upper
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        if log_delta_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return round_up(hi)


# ----------------------------------------------------------------------------- Gaussian DP


def gaussian_dp_log_delta(*, mu: float, epsilon: float) -> float:
    """log δ(ε) of μ-GDP: log[Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)], without under/overflow."""
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    log_first = float(log_ndtr(a))
    ratio = math.exp(min(0.0, epsilon + float(log_ndtr(b)) - log_first))
    if ratio >= 1.0:
        return -math.inf
    return log_first + math.log1p(-ratio)


def gaussian_dp_delta(*, mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP (Balle & Wang 2018, Thm 8; Dong, Roth & Su 2019, Cor 2.13)."""
    return math.exp(gaussian_dp_log_delta(mu=mu, epsilon=epsilon))


def gaussian_dp_epsilon(*, mu: float, delta: float) -> float:
    """The smallest ε with δ_μ(ε) ≤ δ, rounded up (0 for μ = 0)."""
    delta = validate_delta(delta)
    if mu == 0.0:
        return 0.0
    if not (math.isfinite(mu) and mu > 0.0):
        raise ValueError(f"μ must be finite and >= 0, got {mu!r}")
    # δ_μ(ε) ≤ Φ(−ε/μ + μ/2) ≤ δ once ε ≥ μ²/2 + μ·sqrt(2 log(1/δ)): a valid upper end.
    # −log δ, not log(1/δ): 1/δ overflows to inf for a subnormal δ.
    upper = mu * mu / 2.0 + mu * math.sqrt(-2.0 * math.log(delta)) + 1.0
    return _smallest_epsilon(lambda eps: gaussian_dp_log_delta(mu=mu, epsilon=eps), delta=delta, upper=upper)


# ----------------------------------------------------------------------------- pure DP (KOV)


def pure_dp_composition_log_delta(*, epsilon0: float, count: int, epsilon: float) -> float:
    """log δ(ε) of k-fold randomized response with parameter ε0 (the optimal adaptive composition
    of k ε0-DP mechanisms, Kairouz-Oh-Viswanath 2015 Thm 3.3):

        δ(ε) = Σ_{l=0}^{k} C(k, l) [ (1−p)^{k−l} p^l − e^ε p^{k−l} (1−p)^l ]_+ ,  p = 1/(1 + e^{ε0}),

    (l, ``unlikely`` below, = number of coordinates on P's less likely side; the bracket is
    positive iff ε0·(k − 2l) > ε), summed in log space so k up to 10^5 neither over- nor underflows."""
    k = int(count)
    unlikely = np.arange(k + 1, dtype=np.float64)
    loss = epsilon0 * (k - 2.0 * unlikely)
    keep = loss > epsilon
    if not keep.any():
        return -math.inf
    unlikely, loss = unlikely[keep], loss[keep]
    log_p = -np.logaddexp(0.0, epsilon0)  # log 1/(1+e^ε0)
    log_1mp = -np.logaddexp(0.0, -epsilon0)  # log e^ε0/(1+e^ε0)
    log_binom = gammaln(k + 1.0) - gammaln(unlikely + 1.0) - gammaln(k - unlikely + 1.0)
    log_p_mass = log_binom + (k - unlikely) * log_1mp + unlikely * log_p
    terms = log_p_mass + np.log1p(-np.exp(epsilon - loss))  # Q mass / P mass = e^{−loss}
    return float(np.logaddexp.reduce(terms))


def pure_dp_composition_epsilon(*, epsilon0: float, count: int, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ δ for k adaptively composed ε0-DP mechanisms, rounded up."""
    delta = validate_delta(delta)
    if count == 0:
        return 0.0
    return _smallest_epsilon(
        lambda eps: pure_dp_composition_log_delta(epsilon0=epsilon0, count=count, epsilon=eps),
        delta=delta,
        upper=epsilon0 * count,
    )


# ----------------------------------------------------------------------------- PLD fallback


def pld_epsilon(event: PrivacyEvent, delta: float) -> float:
    """dp-accounting's pessimistic PLD ε of an event of Gaussian, subsampled-Gaussian, Laplace
    and pure-DP leaves (add/remove neighbours: both directions of every PLD are kept)."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_module

    delta = validate_delta(delta)
    if delta < DELTA_MIN:
        raise PrivacyEventError(f"no PLD bound below delta = {DELTA_MIN:g}")  # skipped, like a failure
    leaves = _aggregate(iter_leaves(event))
    if not leaves:
        return 0.0
    interval = _pld_interval(leaves)
    total = None
    for leaf in leaves:
        if isinstance(leaf, GaussianEvent):
            one = pld_module.from_gaussian_mechanism(
                leaf.noise_multiplier / math.sqrt(leaf.count),
                pessimistic_estimate=True,
                value_discretization_interval=interval,
            )
        elif isinstance(leaf, PoissonSampledGaussianEvent):
            one = pld_module.from_gaussian_mechanism(
                leaf.noise_multiplier,
                sampling_prob=leaf.sampling_probability,
                pessimistic_estimate=True,
                value_discretization_interval=interval,
            ).self_compose(leaf.count)
        elif isinstance(leaf, LaplaceEvent):
            one = pld_module.from_laplace_mechanism(
                leaf.noise_multiplier,
                pessimistic_estimate=True,
                value_discretization_interval=interval,
            ).self_compose(leaf.count)
        elif isinstance(leaf, PureDPEvent):
            one = pld_module.from_privacy_parameters(
                common.DifferentialPrivacyParameters(leaf.epsilon, 0.0),
                value_discretization_interval=interval,
            ).self_compose(leaf.count)
        else:
            raise TypeError(f"no PLD for {type(leaf).__name__}")
        total = one if total is None else total.compose(one)
    assert total is not None
    return round_up(float(total.get_epsilon_for_delta(delta)))


def _pld_interval(leaves: tuple[LeafEvent, ...]) -> float:
    """Discretisation interval: 1e-4, coarsened so the composed loss range (bounded by the leaves'
    RDP-free worst cases, ~count·per-use range) spans at most PLD_MAX_BUCKETS buckets."""
    spread = 0.0
    for leaf in leaves:
        count = leaf.count
        if isinstance(leaf, GaussianEvent):
            mu = math.sqrt(count) / leaf.noise_multiplier
            spread += mu * mu + 20.0 * mu
        elif isinstance(leaf, PoissonSampledGaussianEvent):
            q, s = leaf.sampling_probability, leaf.noise_multiplier
            per_use = math.log1p(q * math.expm1(min(1.0 / (s * s), 50.0)))  # mean-scale of one use
            spread += count * per_use + 20.0 * math.sqrt(count) * per_use + 20.0 / s
        elif isinstance(leaf, LaplaceEvent):
            spread += 2.0 * min(count, 20.0 * math.sqrt(count)) / leaf.noise_multiplier
        else:
            spread += 2.0 * min(count, 20.0 * math.sqrt(count)) * getattr(leaf, "epsilon")  # noqa: B009 - ε-DP or bounded range
    return max(1e-4, spread / PLD_MAX_BUCKETS)


# ----------------------------------------------------------------------------- RDP at δ


def rdp_single_job_epsilon(event: PrivacyEvent, delta: float) -> float:
    """RDP of this job converted at δ (no union bound): the grid orders, and every real order
    α > 1 when all leaves have closed-form RDP. Each candidate is evaluated with outward rounding
    at its own α, so the optimiser's accuracy affects tightness only, never validity."""
    delta = validate_delta(delta)
    if contains_tuning(event):
        return max(0.0, epsilon_from_rdp(rdp_curve(event), delta)[0])  # grid orders only
    leaves = _aggregate(iter_leaves(event))
    if not leaves:
        return 0.0  # no mechanism ran
    best = epsilon_from_rdp(rdp_curve(event), delta)[0]
    closed_form = all(isinstance(leaf, _CLOSED_FORM) or _is_gaussian(leaf, zcdp_is_gaussian=False) for leaf in leaves)
    if closed_form:
        order = _best_real_order(leaves, delta)
        best = min(best, _converted(leaves, order=order, delta=delta))
    return max(0.0, best)


_CLOSED_FORM = (GaussianEvent, ZCDPEvent, PureDPEvent, ExponentialMechanismEvent)


def _rdp_terms(leaves: tuple[LeafEvent, ...], order: float) -> list[float]:
    """Per-leaf RDP at a real order, each rounded up (the formulas of kernel.privacy.rdp)."""
    terms = []
    for leaf in leaves:
        count = leaf.count
        if isinstance(leaf, ZCDPEvent):
            value = leaf.rho * order
        elif isinstance(leaf, PureDPEvent):
            value = min(leaf.epsilon, order * leaf.epsilon**2 / 2.0)
        elif isinstance(leaf, ExponentialMechanismEvent):
            value = min(leaf.epsilon, order * leaf.epsilon**2 / 8.0)
        else:
            sigma = leaf.noise_multiplier
            value = order / (2.0 * sigma * sigma)
        terms.append(round_up(round_up(value) * count))
    return terms


def _converted(leaves: tuple[LeafEvent, ...], *, order: float, delta: float) -> float:
    """ε at one real order: Σ RDP + log1p(−1/α) − (log δ + log α)/(α − 1), rounded outward."""
    t0 = math.log1p(-1.0 / order)
    t1 = -(math.log(delta) + math.log(order)) / (order - 1.0)
    return round_up_sum((*_rdp_terms(leaves, order), t0, t1))


def _best_real_order(leaves: tuple[LeafEvent, ...], delta: float) -> float:
    """A near-optimal α: a log-spaced scan of α − 1 over [1e-4, 1e7], refined by bounded Brent."""

    def objective(log_excess: float) -> float:
        order = 1.0 + math.exp(log_excess)
        return math.fsum(
            (*_rdp_terms(leaves, order), math.log1p(-1.0 / order), -(math.log(delta) + math.log(order)) / (order - 1.0))
        )

    grid = np.linspace(math.log(1e-4), math.log(_MAX_ORDER), 400)
    values = [objective(x) for x in grid]
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if hi > lo:
        result = minimize_scalar(objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
        x = float(result.x) if result.fun <= values[i] else float(grid[i])
    else:
        x = float(grid[i])
    return 1.0 + math.exp(x)
