"""The owner's declared preparation (issue 14): strict parsing, a canonical stored form, and the
transform the worker applies (drop, one-hot, scaling with clipping)."""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kernel.ingest import (
    DatasetValidationError,
    IngestLimits,
    ParsedDataset,
    parse_dataset,
    parse_preparation,
    preparation_from_json,
    preparation_report,
)
from kernel.ingest.columns import ScalingGroup
from kernel.ingest.preparation import MinMax, Standardise
from kernel.ingest.scaling import apply_scaling

LIMITS = IngestLimits()

column_names = st.text(alphabet="abcxyz_ 0", min_size=1, max_size=6)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@st.composite
def scalings(draw: st.DrawFn) -> dict[str, object]:
    if draw(st.booleans()):
        low = draw(finite)
        high = low + draw(st.floats(min_value=1e-3, max_value=1e6))
        return {"bounds": [low, high], "range": draw(st.sampled_from([[0.0, 1.0], [-1.0, 1.0]]))}
    return {"center": draw(finite), "scale": draw(st.floats(min_value=1e-3, max_value=1e6))}


@st.composite
def declarations(draw: st.DrawFn) -> dict[str, object]:
    names = draw(st.lists(column_names, min_size=0, max_size=8, unique=True))
    roles = [draw(st.sampled_from(["drop", "one_hot", "scale"])) for _ in names]
    declared: dict[str, object] = {}
    drop = [name for name, role in zip(names, roles, strict=True) if role == "drop"]
    if drop:
        declared["drop"] = drop
    one_hot = {
        name: draw(st.lists(st.text(alphabet="pqr1", min_size=1, max_size=3), min_size=1, max_size=4, unique=True))
        for name, role in zip(names, roles, strict=True)
        if role == "one_hot"
    }
    if one_hot:
        declared["one_hot"] = one_hot
    scale = {name: draw(scalings()) for name, role in zip(names, roles, strict=True) if role == "scale"}
    if draw(st.booleans()):
        scale["*"] = draw(scalings())
    if scale:
        declared["scale"] = scale
    if draw(st.booleans()):
        declared["labels"] = "indices"
    return declared


@settings(database=None, max_examples=100, deadline=None)
@given(declared=declarations())
def test_a_valid_declaration_round_trips_through_its_canonical_form(declared: dict[str, object]) -> None:
    parsed = parse_preparation(json.dumps(declared), limits=LIMITS)
    if not declared:
        assert parsed is None
        return
    assert parsed is not None and parsed.to_json() == declared
    assert preparation_from_json(json.loads(json.dumps(parsed.to_json())), limits=LIMITS) == parsed


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["drop", "one_hot", "scale", "labels", "bounds", "range", "center", "a", "*"]),
            children,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@settings(database=None, max_examples=300, deadline=None)
@given(document=json_values)
def test_any_json_is_a_declaration_or_a_bad_preparation(document: object) -> None:
    try:
        raw = json.dumps(document)
    except ValueError:
        return
    try:
        parse_preparation(raw, limits=LIMITS)
    except DatasetValidationError as error:
        assert error.reason == "bad-preparation" and error.detail.startswith("preparation: ")


@settings(database=None, max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_any_text_is_a_declaration_or_a_bad_preparation(text: str) -> None:
    try:
        parse_preparation(text, limits=LIMITS)
    except DatasetValidationError as error:
        assert error.reason == "bad-preparation"


def test_a_declaration_too_long_is_refused() -> None:
    with pytest.raises(DatasetValidationError) as caught:
        parse_preparation('{"drop": [' + ",".join(['"c"'] * 5000) + "]}", limits=LIMITS)
    assert "at most 16000" in caught.value.detail


@settings(database=None, max_examples=100, deadline=None)
@given(
    X=hnp.arrays(np.float32, (7, 3), elements=st.floats(-1e4, 1e4, width=32)),
    low=st.floats(-100, 100),
    width=st.floats(0.5, 500),
    target=st.sampled_from([(0.0, 1.0), (-1.0, 1.0)]),
)
def test_bounds_clip_then_scale_into_the_target_range(
    X: np.ndarray, low: float, width: float, target: tuple[float, float]
) -> None:
    scaling = MinMax(low=low, high=low + width, target=target)
    scaled = X.copy()
    apply_scaling(scaled, [ScalingGroup(features=np.array([0, 2]), scaling=scaling)])
    np.testing.assert_array_equal(scaled[:, 1], X[:, 1])  # not in the group: untouched
    a, b = target
    assert np.all(scaled[:, [0, 2]] >= a) and np.all(scaled[:, [0, 2]] <= b)
    expected = a + (np.clip(X[:, [0, 2]].astype(np.float64), low, low + width) - low) / width * (b - a)
    np.testing.assert_allclose(scaled[:, [0, 2]], expected.astype(np.float32), rtol=1e-6, atol=1e-6)
    below = X[:, [0, 2]].astype(np.float64) <= low
    np.testing.assert_array_equal(scaled[:, [0, 2]][below], a)  # clipped to the bound's image


def test_center_and_scale_standardise_without_clipping() -> None:
    X = np.array([[0.0, 10.0], [5.0, 1000.0]], dtype=np.float32)
    apply_scaling(X, [ScalingGroup(features=None, scaling=Standardise(center=5.0, scale=2.5))])
    np.testing.assert_array_equal(X, [[-2.0, 2.0], [0.0, 398.0]])


def _write(rows: list[list[object]], header: list[str]) -> Path:
    directory = Path(tempfile.mkdtemp())
    path = directory / "data.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _parse(path: Path, declared: dict[str, object] | None) -> ParsedDataset:
    return parse_dataset(
        path,
        fmt="csv",
        label_column="label",
        task=None,
        limits=LIMITS,
        preparation=parse_preparation(json.dumps(declared), limits=LIMITS) if declared else None,
    )


@settings(database=None, max_examples=60, deadline=None)
@given(
    data=st.data(),
    categories=st.lists(st.sampled_from(["red", "green", "blue", "1"]), min_size=1, max_size=4, unique=True),
)
def test_one_hot_puts_a_single_one_at_each_rows_category(data: st.DataObject, categories: list[str]) -> None:
    values = data.draw(st.lists(st.sampled_from(categories), min_size=2, max_size=20))
    rows = [[f"id{i}", value, float(i), i % 2] for i, value in enumerate(values)]
    rows[0][-1], rows[1][-1] = 0, 1
    parsed = _parse(_write(rows, ["id", "colour", "x", "label"]), {"drop": ["id"], "one_hot": {"colour": categories}})
    assert parsed.feature_names == (*(f"colour={c}" for c in categories), "x")
    one_hot = parsed.X[:, : len(categories)]
    np.testing.assert_array_equal(one_hot.sum(axis=1), 1.0)
    assert [categories[i] for i in one_hot.argmax(axis=1)] == values
    np.testing.assert_array_equal(parsed.X[:, -1], np.arange(len(values), dtype=np.float32))


def test_named_scaling_wins_over_the_default_for_every_feature() -> None:
    rows = [[10.0, 10.0, 200.0, 0], [0.0, 5.0, -50.0, 1]]
    parsed = _parse(
        _write(rows, ["a", "b", "c", "label"]),
        {
            "scale": {
                "a": {"bounds": [0, 20]},
                "*": {"center": 5, "scale": 5},
                "c": {"bounds": [0, 100], "range": [-1, 1]},
            }
        },
    )
    np.testing.assert_allclose(parsed.X, [[0.5, 1.0, 1.0], [0.0, 0.0, -1.0]])


def test_a_standardised_value_beyond_float32_is_refused_naming_the_cell() -> None:
    rows = [[1.0, 0], [3e38, 1]]
    with pytest.raises(DatasetValidationError) as caught:
        _parse(_write(rows, ["a", "label"]), {"scale": {"a": {"center": 0, "scale": 1e-3}}})
    assert caught.value.reason == "non-finite"
    assert "line 3" in caught.value.detail and "'a'" in caught.value.detail


def test_a_one_hot_name_that_clashes_with_a_column_is_refused() -> None:
    rows = [["x", 1.0, 0], ["x", 2.0, 1]]
    with pytest.raises(DatasetValidationError) as caught:
        _parse(_write(rows, ["c", "c=x", "label"]), {"one_hot": {"c": ["x"]}})
    assert caught.value.reason == "bad-preparation" and "'c=x'" in caught.value.detail


def test_the_report_block_states_what_was_applied() -> None:
    assert preparation_report(None)["declared"] is False
    block = preparation_report({"drop": ["id"], "scale": {"*": {"center": 0.0, "scale": 2.0}}})
    assert block["declared"] is True and block["drop"] == ["id"] and "one_hot" not in block
    assert block["scale"] == {"*": {"center": 0.0, "scale": 2.0}} and "no privacy" in block["privacy"]
