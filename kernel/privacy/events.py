"""Immutable descriptions of the mechanisms a job runs (in the spirit of dp_accounting's DpEvent).

An event is what the server charges before a job runs (docs/privacy-model.md#cost), so it validates itself on
construction: a malformed event must not reach the RDP code, the ledger or the worker. Numeric
fields are normalised to ``float``/``int`` so that equal events compare and hash equal whatever
numeric types the caller used.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import ClassVar, Final, TypeVar

from kernel.privacy.errors import PrivacyEventError

_E = TypeVar("_E")

# Filled once at import by @_register_kind; exposed read-only as EVENT_KINDS.
_KINDS: dict[str, type] = {}


def _register_kind(cls: type[_E]) -> type[_E]:
    """Record an event class under its ``KIND`` so the JSON codec needs no if/elif chain."""
    kind = getattr(cls, "KIND")  # noqa: B009 - any class to mypy: KIND is checked at run time
    if kind in _KINDS:
        raise RuntimeError(f"event kind {kind!r} registered twice")
    _KINDS[kind] = cls
    return cls


def _number(owner: object, name: str) -> float:
    """A real, finite number (bools and strings are not numbers here)."""
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PrivacyEventError(f"{type(owner).__name__}.{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise PrivacyEventError(f"{type(owner).__name__}.{name} must be finite, got {number!r}")
    return number


def _set_positive(owner: object, name: str) -> None:
    number = _number(owner, name)
    if number <= 0.0:
        raise PrivacyEventError(f"{type(owner).__name__}.{name} must be > 0, got {number!r}")
    object.__setattr__(owner, name, number)


def _set_probability(owner: object, name: str) -> None:
    number = _number(owner, name)
    if not 0.0 < number <= 1.0:
        raise PrivacyEventError(f"{type(owner).__name__}.{name} must be in (0, 1], got {number!r}")
    object.__setattr__(owner, name, number)


def _set_count(owner: object) -> None:
    value = getattr(owner, "count")  # noqa: B009 - owner is any event to mypy
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PrivacyEventError(f"{type(owner).__name__}.count must be an integer, got {value!r}")
    count = int(value)
    if count < 0:
        raise PrivacyEventError(f"{type(owner).__name__}.count must be >= 0, got {count}")
    object.__setattr__(owner, "count", count)


@_register_kind
@dataclass(frozen=True)
class PoissonSampledGaussianEvent:
    """``count`` steps of a Gaussian sum query on a Poisson sample (each row kept with prob. q)."""

    KIND: ClassVar[str] = "poisson_subsampled_gaussian"
    sampling_probability: float
    noise_multiplier: float
    count: int

    def __post_init__(self) -> None:
        _set_probability(self, "sampling_probability")
        _set_positive(self, "noise_multiplier")
        _set_count(self)


@_register_kind
@dataclass(frozen=True)
class GaussianEvent:
    """``count`` Gaussian mechanisms; noise_multiplier = noise std / L2 sensitivity."""

    KIND: ClassVar[str] = "gaussian"
    noise_multiplier: float
    count: int

    def __post_init__(self) -> None:
        _set_positive(self, "noise_multiplier")
        _set_count(self)


@_register_kind
@dataclass(frozen=True)
class LaplaceEvent:
    """``count`` Laplace mechanisms; noise_multiplier = scale b / L1 sensitivity (pure eps = 1/b)."""

    KIND: ClassVar[str] = "laplace"
    noise_multiplier: float
    count: int

    def __post_init__(self) -> None:
        _set_positive(self, "noise_multiplier")
        _set_count(self)


@_register_kind
@dataclass(frozen=True)
class ZCDPEvent:
    """``count`` mechanisms that are each rho-zCDP (RDP rho * alpha at every order)."""

    KIND: ClassVar[str] = "zcdp"
    rho: float
    count: int

    def __post_init__(self) -> None:
        _set_positive(self, "rho")
        _set_count(self)


@_register_kind
@dataclass(frozen=True)
class PureDPEvent:
    """``count`` mechanisms that are each pure epsilon-DP."""

    KIND: ClassVar[str] = "pure_dp"
    epsilon: float
    count: int

    def __post_init__(self) -> None:
        _set_positive(self, "epsilon")
        _set_count(self)


@_register_kind
@dataclass(frozen=True)
class ExponentialMechanismEvent:
    """``count`` exponential mechanisms, each with bounded range epsilon (Durfee-Rogers 2019)."""

    KIND: ClassVar[str] = "exponential_mechanism"
    epsilon: float
    count: int

    def __post_init__(self) -> None:
        _set_positive(self, "epsilon")
        _set_count(self)


@_register_kind
@dataclass(frozen=True)
class ComposedEvent:
    """Sequential (possibly adaptive) composition of the child events."""

    KIND: ClassVar[str] = "composed"
    events: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        children = self.events
        if not isinstance(children, (tuple, list)):
            raise PrivacyEventError(f"ComposedEvent.events must be a tuple of events, got {children!r}")
        children = tuple(children)
        for child in children:
            if not isinstance(child, EVENT_TYPES):
                raise PrivacyEventError(f"ComposedEvent contains a non-event: {child!r}")
        object.__setattr__(self, "events", children)


# Filled once at import by @_register_distribution; exposed read-only as TRIAL_DISTRIBUTION_KINDS.
_DISTRIBUTION_KINDS: dict[str, type] = {}


def _register_distribution(cls: type[_E]) -> type[_E]:
    """Record a trial-count distribution under its ``KIND`` for the JSON codec."""
    kind = getattr(cls, "KIND")  # noqa: B009 - any class to mypy: KIND is checked at run time
    if kind in _DISTRIBUTION_KINDS:
        raise RuntimeError(f"trial distribution kind {kind!r} registered twice")
    _DISTRIBUTION_KINDS[kind] = cls
    return cls


def _set_tnb_shape(owner: object) -> None:
    """eta > -1 and 0 < gamma < 1: the parameters of D_{eta,gamma}."""
    name = type(owner).__name__
    eta = _number(owner, "eta")
    if not eta > -1.0:
        raise PrivacyEventError(f"{name}.eta must be > -1, got {eta!r}")
    gamma = _number(owner, "gamma")
    if not 0.0 < gamma < 1.0:
        raise PrivacyEventError(f"{name}.gamma must be in (0, 1), got {gamma!r}")
    object.__setattr__(owner, "eta", eta)
    object.__setattr__(owner, "gamma", gamma)


def _set_poisson_mean(owner: object) -> None:
    mean = _number(owner, "mean")
    if not mean >= 1.0:
        raise PrivacyEventError(f"{type(owner).__name__}.mean must be >= 1, got {mean!r}")
    object.__setattr__(owner, "mean", mean)


MAX_TRIALS_LIMIT: Final[int] = 10_000
"""The largest public maximum a bounded trial distribution may name (its pmf is summed term by term)."""


def _set_maximum(owner: object) -> None:
    value = _number(owner, "maximum")
    if not value.is_integer() or not 1 <= value <= MAX_TRIALS_LIMIT:
        raise PrivacyEventError(
            f"{type(owner).__name__}.maximum must be a whole number from 1 to {MAX_TRIALS_LIMIT}, got {value!r}"
        )
    object.__setattr__(owner, "maximum", int(value))


@_register_distribution
@dataclass(frozen=True)
class TruncatedNegativeBinomial:
    """The number of tuning trials K ~ D_{eta,gamma} of Papernot-Steinke 2022 (Definition 1), K >= 1.

    eta = 1 is the geometric distribution (mean 1/gamma), eta = 0 the logarithmic distribution."""

    KIND: ClassVar[str] = "truncated_negative_binomial"
    eta: float
    gamma: float

    def __post_init__(self) -> None:
        _set_tnb_shape(self)


@_register_distribution
@dataclass(frozen=True)
class PoissonTrials:
    """K ~ Poisson(mean) tuning trials (K = 0 releases nothing). mean >= 1: below it the
    Papernot-Steinke bound (Theorem 6) does not hold (docs/privacy-model.md#tuning)."""

    KIND: ClassVar[str] = "poisson"
    mean: float

    def __post_init__(self) -> None:
        _set_poisson_mean(self)


@_register_distribution
@dataclass(frozen=True)
class BoundedTruncatedNegativeBinomial:
    """D_{eta,gamma} conditioned on K <= ``maximum``, a public cap: the tuning's schedule (one slot
    per possible trial) is then fixed before K is drawn, so nothing observable depends on K; the
    conditioning costs a small, exactly computed surcharge (docs/privacy-model.md#tuning)."""

    KIND: ClassVar[str] = "bounded_truncated_negative_binomial"
    eta: float
    gamma: float
    maximum: int

    def __post_init__(self) -> None:
        _set_tnb_shape(self)
        _set_maximum(self)

    @property
    def unbounded(self) -> TruncatedNegativeBinomial:
        return TruncatedNegativeBinomial(eta=self.eta, gamma=self.gamma)


@_register_distribution
@dataclass(frozen=True)
class BoundedPoissonTrials:
    """Poisson(mean) conditioned on K <= ``maximum`` (K = 0 still releases nothing)."""

    KIND: ClassVar[str] = "bounded_poisson"
    mean: float
    maximum: int

    def __post_init__(self) -> None:
        _set_poisson_mean(self)
        _set_maximum(self)

    @property
    def unbounded(self) -> PoissonTrials:
        return PoissonTrials(mean=self.mean)


BoundedTrialDistribution = BoundedTruncatedNegativeBinomial | BoundedPoissonTrials
"""A trial-count distribution with a public maximum (every tuning admitted since the maximum exists)."""

TrialDistribution = TruncatedNegativeBinomial | PoissonTrials | BoundedTruncatedNegativeBinomial | BoundedPoissonTrials
"""How many trials a hyperparameter tuning run makes (drawn independently of the data, never released)."""

TRIAL_DISTRIBUTION_TYPES: tuple[type, ...] = (
    TruncatedNegativeBinomial,
    PoissonTrials,
    BoundedTruncatedNegativeBinomial,
    BoundedPoissonTrials,
)

TRIAL_DISTRIBUTION_KINDS: Mapping[str, type] = MappingProxyType(_DISTRIBUTION_KINDS)


@_register_kind
@dataclass(frozen=True)
class HyperparameterTuningEvent:
    """Private hyperparameter tuning (Papernot-Steinke 2022): K ~ ``distribution`` trials, each
    running one of ``candidates`` chosen at random independently of the data (and of the other
    trials), and only the best trial released (docs/privacy-model.md#tuning).

    Not a composition: its candidates are alternatives, never summed, so :func:`iter_leaves`
    refuses it. A candidate must describe a whole trial, its DP hold-out score included."""

    KIND: ClassVar[str] = "hyperparameter_tuning"
    distribution: TrialDistribution
    candidates: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.distribution, TRIAL_DISTRIBUTION_TYPES):
            raise PrivacyEventError(
                f"HyperparameterTuningEvent.distribution must be a trial distribution, got {self.distribution!r}"
            )
        candidates = self.candidates
        if not isinstance(candidates, (tuple, list)):
            raise PrivacyEventError(
                f"HyperparameterTuningEvent.candidates must be a tuple of events, got {candidates!r}"
            )
        candidates = tuple(candidates)
        if not candidates:
            raise PrivacyEventError("HyperparameterTuningEvent needs at least one candidate")
        for candidate in candidates:
            if not isinstance(candidate, EVENT_TYPES):
                raise PrivacyEventError(f"HyperparameterTuningEvent contains a non-event: {candidate!r}")
            if contains_tuning(candidate):
                raise PrivacyEventError("a tuning candidate may not itself contain hyperparameter tuning")
        object.__setattr__(self, "candidates", candidates)


LeafEvent = (
    PoissonSampledGaussianEvent | GaussianEvent | LaplaceEvent | ZCDPEvent | PureDPEvent | ExponentialMechanismEvent
)
"""Every event kind but ComposedEvent and HyperparameterTuningEvent: each has a ``count`` of uses."""

PrivacyEvent = (
    PoissonSampledGaussianEvent
    | GaussianEvent
    | LaplaceEvent
    | ZCDPEvent
    | PureDPEvent
    | ExponentialMechanismEvent
    | ComposedEvent
    | HyperparameterTuningEvent
)

EVENT_TYPES: tuple[type, ...] = (
    PoissonSampledGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    ZCDPEvent,
    PureDPEvent,
    ExponentialMechanismEvent,
    ComposedEvent,
    HyperparameterTuningEvent,
)

EVENT_KINDS: Mapping[str, type] = MappingProxyType(_KINDS)


def field_names(event_type: type) -> tuple[str, ...]:
    """The data fields of an event class, in declaration order (KIND is a ClassVar, not a field)."""
    return tuple(f.name for f in fields(event_type))


def iter_leaves(event: PrivacyEvent) -> Iterator[LeafEvent]:
    """Every non-composed event of the tree, depth first: composition is flat, order is irrelevant.

    Raises on a HyperparameterTuningEvent: its candidates are alternatives, not a composition, and
    a caller that summed them (or counted their uses) would be wrong; check :func:`contains_tuning`."""
    if isinstance(event, ComposedEvent):
        for child in event.events:
            yield from iter_leaves(child)
    elif isinstance(event, HyperparameterTuningEvent):
        raise PrivacyEventError("a hyperparameter tuning event has no leaves to compose (see contains_tuning)")
    else:
        yield event


def contains_tuning(event: PrivacyEvent) -> bool:
    """Whether the tree holds a HyperparameterTuningEvent, whose cost only kernel.privacy.rdp can compute."""
    if isinstance(event, HyperparameterTuningEvent):
        return True
    if isinstance(event, ComposedEvent):
        return any(contains_tuning(child) for child in event.events)
    return False
