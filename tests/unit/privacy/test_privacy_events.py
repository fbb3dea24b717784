"""Events validate themselves, and their versioned JSON round-trips and is parsed strictly."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.privacy import (
    EVENT_SCHEMA_VERSION,
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PrivacyEventError,
    PureDPEvent,
    ZCDPEvent,
    event_from_json,
    event_to_json,
)

positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
probability = st.floats(min_value=1e-9, max_value=1.0, exclude_min=False).filter(lambda q: q > 0.0)
counts = st.integers(min_value=0, max_value=10**9)

leaf_events = st.one_of(
    st.builds(PoissonSampledGaussianEvent, probability, positive, counts),
    st.builds(GaussianEvent, positive, counts),
    st.builds(LaplaceEvent, positive, counts),
    st.builds(ZCDPEvent, positive, counts),
    st.builds(PureDPEvent, positive, counts),
    st.builds(ExponentialMechanismEvent, positive, counts),
)
events = st.recursive(
    leaf_events,
    lambda children: st.lists(children, max_size=4).map(lambda xs: ComposedEvent(tuple(xs))),
    max_leaves=12,
)


@given(events)
@settings(max_examples=200, deadline=None)
def test_json_round_trips_through_text(event: PrivacyEvent) -> None:
    data = event_to_json(event)
    assert data["schema"] == "privtrain.privacy-event"
    assert data["version"] == EVENT_SCHEMA_VERSION == 1
    assert event_from_json(json.loads(json.dumps(data))) == event


def test_json_layout_is_the_documented_one() -> None:
    event = ComposedEvent((PoissonSampledGaussianEvent(0.01, 1.1, 100), LaplaceEvent(noise_multiplier=2, count=3)))
    assert event_to_json(event) == {
        "schema": "privtrain.privacy-event",
        "version": 1,
        "event": {
            "kind": "composed",
            "events": [
                {
                    "kind": "poisson_subsampled_gaussian",
                    "sampling_probability": 0.01,
                    "noise_multiplier": 1.1,
                    "count": 100,
                },
                {"kind": "laplace", "noise_multiplier": 2.0, "count": 3},
            ],
        },
    }


def test_equal_events_with_int_or_float_parameters_are_equal_and_hash_equal() -> None:
    assert GaussianEvent(2, 5) == GaussianEvent(2.0, 5)
    assert hash(GaussianEvent(2, 5)) == hash(GaussianEvent(2.0, 5))
    assert isinstance(GaussianEvent(2, 5).noise_multiplier, float)


@pytest.mark.parametrize(
    "build",
    [
        lambda: GaussianEvent(0.0, 1),
        lambda: GaussianEvent(-1.0, 1),
        lambda: GaussianEvent(math.nan, 1),
        lambda: GaussianEvent(math.inf, 1),
        lambda: GaussianEvent(True, 1),
        lambda: GaussianEvent("1.0", 1),  # type: ignore[arg-type]
        lambda: GaussianEvent(1.0, -1),
        lambda: GaussianEvent(1.0, 1.5),  # type: ignore[arg-type]
        lambda: GaussianEvent(1.0, 2.0),  # type: ignore[arg-type]
        lambda: GaussianEvent(1.0, True),
        lambda: PoissonSampledGaussianEvent(0.0, 1.0, 1),
        lambda: PoissonSampledGaussianEvent(1.0000001, 1.0, 1),
        lambda: PoissonSampledGaussianEvent(-0.1, 1.0, 1),
        lambda: PoissonSampledGaussianEvent(math.nan, 1.0, 1),
        lambda: LaplaceEvent(0.0, 1),
        lambda: ZCDPEvent(-1e-3, 1),
        lambda: PureDPEvent(math.inf, 1),
        lambda: ExponentialMechanismEvent(0.0, 1),
        lambda: ComposedEvent((GaussianEvent(1.0, 1), "gaussian")),  # type: ignore[arg-type]
        lambda: ComposedEvent(GaussianEvent(1.0, 1)),  # type: ignore[arg-type]
    ],
)
def test_constructors_reject_invalid_fields(build: Any) -> None:
    with pytest.raises(PrivacyEventError):
        build()


def test_privacy_event_error_is_a_value_error() -> None:
    assert issubclass(PrivacyEventError, ValueError)


def test_events_are_immutable() -> None:
    event = GaussianEvent(1.0, 1)
    with pytest.raises(AttributeError):
        event.noise_multiplier = 0.1  # type: ignore[misc]


_VALID = event_to_json(ComposedEvent((GaussianEvent(1.0, 2), PureDPEvent(0.5, 1))))


def _mutated(path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_VALID)
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    "data",
    [
        _mutated(["schema"], "something-else"),
        _mutated(["version"], 2),
        _mutated(["version"], 1.0),
        _mutated(["version"], True),
        _mutated(["version"], "1"),
        _mutated(["extra"], 1),
        _mutated(["event"], _DELETE) | {"x": 1},
        _mutated(["event", "kind"], "poisson_sampled_gaussian"),
        _mutated(["event", "kind"], None),
        _mutated(["event", "events"], "not a list"),
        _mutated(["event", "events", 0, "kind"], "mystery"),
        _mutated(["event", "events", 0, "extra"], 1),
        _mutated(["event", "events", 0, "count"], _DELETE),
        _mutated(["event", "events", 0, "count"], 2.0),
        _mutated(["event", "events", 0, "count"], -1),
        _mutated(["event", "events", 0, "count"], "2"),
        _mutated(["event", "events", 0, "noise_multiplier"], math.nan),
        _mutated(["event", "events", 0, "noise_multiplier"], math.inf),
        _mutated(["event", "events", 0, "noise_multiplier"], 0.0),
        _mutated(["event", "events", 0, "noise_multiplier"], -2.0),
        _mutated(["event", "events", 0, "noise_multiplier"], "1.0"),
        _mutated(["event", "events", 0, "noise_multiplier"], None),
        _mutated(["event", "events", 0, "noise_multiplier"], True),
        _mutated(["event", "events", 1, "epsilon"], [0.5]),
        {
            "schema": "privtrain.privacy-event",
            "version": 1,
            "event": {
                "kind": "poisson_subsampled_gaussian",
                "sampling_probability": 1.5,
                "noise_multiplier": 1.0,
                "count": 1,
            },
        },
        {
            "schema": "privtrain.privacy-event",
            "version": 1,
            "event": {
                "kind": "poisson_subsampled_gaussian",
                "sampling_probability": 0.0,
                "noise_multiplier": 1.0,
                "count": 1,
            },
        },
        {"schema": "privtrain.privacy-event", "version": 1, "event": ["gaussian", 1.0, 1]},
        [],
        "gaussian",
    ],
)
def test_malformed_json_is_rejected(data: Any) -> None:
    with pytest.raises(PrivacyEventError):
        event_from_json(data)


def test_nan_smuggled_through_json_text_is_rejected() -> None:
    text = json.dumps(_VALID).replace('"noise_multiplier": 1.0', '"noise_multiplier": NaN')
    assert "NaN" in text
    with pytest.raises(PrivacyEventError):
        event_from_json(json.loads(text))


def test_absurdly_deep_trees_are_rejected() -> None:
    node: dict[str, Any] = {"kind": "gaussian", "noise_multiplier": 1.0, "count": 1}
    for _ in range(100):
        node = {"kind": "composed", "events": [node]}
    with pytest.raises(PrivacyEventError):
        event_from_json({"schema": "privtrain.privacy-event", "version": 1, "event": node})


@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(st.sampled_from(["kind", "count", "events", "epsilon", "rho", "x"]), children, max_size=4),
        ),
        max_leaves=10,
    )
)
@settings(max_examples=300, deadline=None)
def test_random_junk_is_rejected_unless_it_is_exactly_canonical(junk: Any) -> None:
    data = {"schema": "privtrain.privacy-event", "version": 1, "event": junk}
    try:
        event = event_from_json(data)
    except PrivacyEventError:
        return
    assert event_to_json(event) == data  # only a well-formed event (e.g. a random "zcdp") parses
