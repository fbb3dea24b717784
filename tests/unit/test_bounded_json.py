"""Bounded JSON (kernel/bounded_json.py): any text parses as plain ``json.loads`` would, or is one
:class:`JsonRefused` with a stable reason; never a ValueError, RecursionError or a non-finite float."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.bounded_json import JsonBounds, JsonRefused, loads_bounded, nesting_depth

BOUNDS = JsonBounds(max_chars=100_000, max_depth=8, max_number_chars=30)
REASONS = {"too-large", "too-deep", "number-too-long", "non-finite-number", "invalid-json"}

json_trees = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab"\\[]{}:,\u00e9\ud7ff'), max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=20,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _longest_number(value: object) -> int:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return 0
    if isinstance(value, (int, float)):
        return len(json.dumps(value))
    children = value.values() if isinstance(value, dict) else value
    return max(map(_longest_number, children), default=0)  # type: ignore[arg-type]


@settings(database=None, max_examples=300, deadline=None)
@given(tree=json_trees, wrap=st.integers(0, 12))
def test_a_json_tree_parses_exactly_or_is_refused_for_its_depth_or_numbers(tree: object, wrap: int) -> None:
    for _ in range(wrap):
        tree = [tree]
    text = json.dumps(tree)
    assert nesting_depth(text) == _depth(tree)
    try:
        parsed = loads_bounded(text, bounds=BOUNDS)
    except JsonRefused as refused:
        assert refused.reason in ("too-deep", "number-too-long")
        assert _depth(tree) > BOUNDS.max_depth or _longest_number(tree) > BOUNDS.max_number_chars
        return
    assert parsed == json.loads(text)
    assert _depth(tree) <= BOUNDS.max_depth and _longest_number(tree) <= BOUNDS.max_number_chars


LENIENT = JsonBounds(max_chars=100_000, max_depth=8, max_number_chars=30, allow_non_finite=True)


@settings(database=None, max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from('[]{}",:0123456789.eE-+ \\ntrufalsNIiy'), max_size=60),
    bounds=st.sampled_from([BOUNDS, LENIENT]),
)
def test_any_text_is_json_or_one_refusal(text: str, bounds: JsonBounds) -> None:
    try:
        parsed = loads_bounded(text, bounds=bounds)
    except JsonRefused as refused:
        assert refused.reason in REASONS and refused.detail
        assert not (bounds.allow_non_finite and refused.reason == "non-finite-number")
        return
    assert json.dumps(parsed) == json.dumps(json.loads(text))  # NaN compares unequal to itself


@pytest.mark.parametrize("run", [31, 40, 5000])
def test_a_long_number_is_refused_where_non_finite_floats_are_allowed(run: int) -> None:
    for literal in ("1" * run, "1." + "0" * run, "-1e" + "0" * run, "0." + "1" * (run // 3) + "e" + "1" * run):
        with pytest.raises(JsonRefused) as caught:
            loads_bounded("[" + literal + "]", bounds=LENIENT)
        assert caught.value.reason == "number-too-long"
    assert loads_bounded("[NaN, 1e999, 1.5]", bounds=LENIENT) is not None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 5000 + "]" * 5000, "too-deep"),  # a RecursionError for json.loads
        ("[" * 9 + "]" * 9, "too-deep"),
        ('{"a": ' + "1" * 5000 + "}", "number-too-long"),  # a ValueError for json.loads (4,300 digits)
        ("[" + "1" * 31 + "]", "number-too-long"),
        ("[1." + "0" * 40 + "]", "number-too-long"),
        ("[1e999]", "non-finite-number"),
        ("[-1e999]", "non-finite-number"),
        ("[NaN]", "non-finite-number"),
        ('{"a": Infinity}', "non-finite-number"),
        ("[1,", "invalid-json"),
        ("x" * 100_001, "too-large"),
    ],
)
def test_the_hostile_shapes_are_refused_with_their_reason(text: str, reason: str) -> None:
    with pytest.raises(JsonRefused) as caught:
        loads_bounded(text, bounds=BOUNDS)
    assert caught.value.reason == reason
    assert "1111" not in caught.value.detail  # says where or what kind, never the value


def test_brackets_inside_strings_do_not_nest() -> None:
    text = json.dumps({"a": "[[[[[[[[[[[[[[[[[[[[", "b": ['\\"]]]]', "{{{{{{{{{{{"]})
    assert nesting_depth(text) == 2
    assert loads_bounded(text, bounds=BOUNDS) == json.loads(text)


def test_a_large_flat_document_is_within_bounds() -> None:
    text = json.dumps({"x": list(range(20_000)), "y": [math.pi] * 1000})
    assert loads_bounded(text, bounds=JsonBounds(max_chars=len(text))) == json.loads(text)
