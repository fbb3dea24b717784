"""The tightest valid ε of ONE job at δ, for the report: the minimum over several accountants.

The ledger charges RDP because RDP composes into a valid filter over adaptively chosen jobs; the
numbers below are valid for a single job only and never touch the ledger. Each accountant
(:mod:`kernel.privacy.accounting`) is a true upper bound on its own, so the answer is the minimum
over those that support the event and answered, and the one that won is named. An accountant that
raises or returns a non-finite value is skipped (never read as "small"); the ledger's own RDP
accountant supports every event and is always a candidate, so there is always an answer and it is
never larger than the ledger's. See docs/single-job-epsilon.md and docs/privacy-model.md#accountants.

Which accountant prices which event is asked of each (``supports``), never decided here by the
event's kind; what this module decides is how each :class:`~kernel.privacy.accountant.Role` is
used. Methods (slugs in :data:`METHODS`, the order candidates are listed in):

* ``gaussian-dp`` (exact) — every leaf a Gaussian: the exact μ-GDP profile (:mod:`kernel.privacy.gaussian_dp`).
* ``pure-dp-optimal`` (exact) — every leaf ε0-DP with one common ε0: the optimal composition
  (:mod:`kernel.privacy.pure_dp_optimal`).
* ``prv`` (numeric) — prv-accountant for the other compositions, on dominating mechanisms
  (:mod:`kernel.privacy.prv_accountant`, :mod:`kernel.privacy.dominating`).
* ``pld`` (numeric) — dp-accounting's pessimistic PLDs for the same leaves, only when
  prv-accountant fails (:mod:`kernel.privacy.pld_accountant`).
* ``rdp-single-job`` (bound) — the event's RDP converted at δ itself, over real orders where the
  leaves allow (:mod:`kernel.privacy.rdp_single_job`).
* ``rdp`` (ledger) — the ledger's own number (:mod:`kernel.privacy.rdp_accountant`).

An exact profile that answered leaves nothing for a numeric accountant to improve; the numeric
ones run only for an event whose cheap bound is at most NUMERIC_MAX_EPSILON, at δ >= DELTA_MIN,
and off the request path (``numeric=True``, or in the capped child process). An event containing
hyperparameter tuning (docs/privacy-model.md#tuning) is supported by the two RDP accountants only:
its cost is known only as an RDP curve.

Not implemented: the adaptive bounded-range composition bound of Dong, Durfee & Rogers 2020
("Optimal Differential Privacy Composition for Exponential Mechanisms and the Cost of
Adaptivity"). They prove that adaptivity costs more than their non-adaptive optimum, so only
their adaptive bound would be valid here; its exact statement could not be checked against the
paper while writing this module, and a privacy bound is not guessed. Bounded-range leaves are
instead covered by the pure-DP optimum and by their ε0²/8-zCDP bound (Cesar & Rogers 2021)
inside ``rdp-single-job``.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final

from kernel.privacy.accountant import PrivacyAccountant, Role
from kernel.privacy.accounting import accountants_for
from kernel.privacy.conversion import validate_delta
from kernel.privacy.events import PrivacyEvent, contains_tuning, iter_leaves
from kernel.privacy.gaussian_dp import gaussian_dp_delta, gaussian_dp_epsilon, gaussian_dp_log_delta
from kernel.privacy.pld_accountant import pld_epsilon
from kernel.privacy.pure_dp_optimal import pure_dp_composition_epsilon, pure_dp_composition_log_delta
from kernel.privacy.ranges import DELTA_MIN
from kernel.privacy.rdp_single_job import rdp_single_job_epsilon

__all__ = [
    "METHODS",
    "NUMERIC_MAX_EPSILON",
    "NUMERIC_MEMORY_BYTES",
    "NUMERIC_TIMEOUT_S",
    "SingleJobEpsilon",
    "capped_single_job_epsilon",
    "gaussian_dp_delta",
    "gaussian_dp_epsilon",
    "gaussian_dp_log_delta",
    "pld_epsilon",
    "pure_dp_composition_epsilon",
    "pure_dp_composition_log_delta",
    "rdp_single_job_epsilon",
    "single_job_epsilon",
    "start_accountant_server",
]

METHODS: Final[tuple[str, ...]] = ("gaussian-dp", "pure-dp-optimal", "prv", "pld", "rdp-single-job", "rdp")

NUMERIC_MAX_EPSILON: Final[float] = 32.0
"""prv-accountant and the PLD are run only when a cheap RDP bound is at most this: their grids
grow with ε (measured 5-50 s per call for ε ≈ 40-300), and beyond it no ε means anything."""

NUMERIC_TIMEOUT_S: Final[float] = 120.0
"""Wall-clock cap of the numeric accountants in :func:`capped_single_job_epsilon`."""

NUMERIC_MEMORY_BYTES: Final[int] = 16 * 2**30
"""Address-space cap of the child process that runs them (σ = 0.01 once needed 23 GB)."""

_CLOSED_FORM_ROLES: Final[frozenset[Role]] = frozenset({Role.EXACT, Role.BOUND, Role.LEDGER})
_NUMERIC_ROLES: Final[frozenset[Role]] = frozenset({Role.NUMERIC})


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
    """The minimum over the accountants that support the event and answered; the ledger's at worst.

    ``zcdp_is_gaussian``: whether every zCDP leaf is a Gaussian release (the algorithm declares it;
    False is always valid). ``numeric=False`` asks the closed-form accountants only (bounded time
    and memory, for the request path); ``numeric=True`` adds prv-accountant / PLD, whose cost is
    not bounded: call it off the request path, under :func:`capped_single_job_epsilon`.
    """
    delta = validate_delta(delta)
    candidates, improvable = _closed_forms(event, delta, zcdp_is_gaussian=zcdp_is_gaussian)
    if numeric and improvable:
        for accountant in _supporting(event, zcdp_is_gaussian=zcdp_is_gaussian, roles=_NUMERIC_ROLES):
            if _attempt(candidates, accountant, event, delta):
                break  # the first numeric answer is kept (PLD is prv-accountant's fallback)
    return min(candidates, key=lambda c: c.epsilon)


def _closed_forms(event: PrivacyEvent, delta: float, *, zcdp_is_gaussian: bool) -> tuple[list[SingleJobEpsilon], bool]:
    """The closed-form candidates, and whether a numeric accountant could still improve on them."""
    candidates: list[SingleJobEpsilon] = []
    exact = False
    ran = _runs_a_mechanism(event)
    for accountant in _supporting(event, zcdp_is_gaussian=zcdp_is_gaussian, roles=_CLOSED_FORM_ROLES):
        if accountant.role is Role.EXACT and not ran:
            continue  # the RDP bounds already say 0; a profile would name a mechanism that never ran
        if accountant.role is Role.LEDGER:  # always answers: its failure is the event's failure
            value = accountant.compose(event).epsilon(delta)
            candidates.append(SingleJobEpsilon(value, accountant.method, accountant.label))
        elif _attempt(candidates, accountant, event, delta) and accountant.role is Role.EXACT:
            exact = True
    return candidates, _numeric_applies(
        event, candidates, delta, exact=exact, ran=ran, zcdp_is_gaussian=zcdp_is_gaussian
    )


def _numeric_applies(
    event: PrivacyEvent,
    candidates: list[SingleJobEpsilon],
    delta: float,
    *,
    exact: bool,
    ran: bool,
    zcdp_is_gaussian: bool,
) -> bool:
    """prv/PLD can only improve on the closed forms for inexact events that ran a mechanism, whose
    cheap bound is small enough for their grids (NUMERIC_MAX_EPSILON) and which a numeric
    accountant supports, at a delta inside the validated range (a stored sub-DELTA_MIN delta gets
    the closed forms only)."""
    cheap_bound = min(c.epsilon for c in candidates)
    return (
        not exact
        and ran
        and cheap_bound <= NUMERIC_MAX_EPSILON
        and delta >= DELTA_MIN
        and bool(_supporting(event, zcdp_is_gaussian=zcdp_is_gaussian, roles=_NUMERIC_ROLES))
    )


def _supporting(event: PrivacyEvent, *, zcdp_is_gaussian: bool, roles: frozenset[Role]) -> list[PrivacyAccountant]:
    """Fresh accountants of ``roles`` that support the event, in METHODS order (which breaks ties)."""
    found = accountants_for(event, zcdp_is_gaussian=zcdp_is_gaussian, roles=roles)
    return sorted(found, key=lambda accountant: METHODS.index(accountant.method))


def _runs_a_mechanism(event: PrivacyEvent) -> bool:
    """Whether some mechanism of the event is used at least once (a tuning runs its trials)."""
    return contains_tuning(event) or any(leaf.count > 0 for leaf in iter_leaves(event))


def _attempt(
    candidates: list[SingleJobEpsilon], accountant: PrivacyAccountant, event: PrivacyEvent, delta: float
) -> bool:
    """Ask one accountant; any exception, NaN, inf or negative value means it is skipped."""
    try:
        value = accountant.compose(event).epsilon(delta)
    except Exception:  # noqa: BLE001 - a failed method is skipped, never read as a small number
        return False
    if not math.isfinite(value) or value < 0.0:
        return False
    candidates.append(SingleJobEpsilon(float(value), accountant.method, accountant.label))
    return True


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
    candidates, improvable = _closed_forms(event, delta, zcdp_is_gaussian=zcdp_is_gaussian)
    closed = min(candidates, key=lambda c: c.epsilon)
    if not improvable:
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
