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
from typing import ClassVar, TypeVar

from app.privacy.errors import PrivacyEventError

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


LeafEvent = (
    PoissonSampledGaussianEvent | GaussianEvent | LaplaceEvent | ZCDPEvent | PureDPEvent | ExponentialMechanismEvent
)
"""Every event kind but ComposedEvent: each has a ``count`` of uses."""

PrivacyEvent = (
    PoissonSampledGaussianEvent
    | GaussianEvent
    | LaplaceEvent
    | ZCDPEvent
    | PureDPEvent
    | ExponentialMechanismEvent
    | ComposedEvent
)

EVENT_TYPES: tuple[type, ...] = (
    PoissonSampledGaussianEvent,
    GaussianEvent,
    LaplaceEvent,
    ZCDPEvent,
    PureDPEvent,
    ExponentialMechanismEvent,
    ComposedEvent,
)

EVENT_KINDS: Mapping[str, type] = MappingProxyType(_KINDS)


def field_names(event_type: type) -> tuple[str, ...]:
    """The data fields of an event class, in declaration order (KIND is a ClassVar, not a field)."""
    return tuple(f.name for f in fields(event_type))


def iter_leaves(event: PrivacyEvent) -> Iterator[LeafEvent]:
    """Every non-composed event of the tree, depth first: composition is flat, order is irrelevant."""
    if isinstance(event, ComposedEvent):
        for child in event.events:
            yield from iter_leaves(child)
    else:
        yield event
