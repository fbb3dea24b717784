"""Printed guarantees round toward +∞ and remaining budgets toward −∞, compared exactly with the
float that was computed (the printed text read back as a float): nearest rounding printed
ε = 3.00012 as ``3``."""

from __future__ import annotations

import math
import re
from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from privtrain_common.directed_rounding import format_guarantee, format_remaining, round_significant

finite = st.floats(allow_nan=False, allow_infinity=False)
digit_counts = st.integers(min_value=1, max_value=10)
COMPACT_VIOLATION = re.compile(r"\.(\d*0)?(e|$)")  # a trailing zero or a bare point, as %g never prints


def _significant_digits(text: str) -> int:
    """Digits of the printed decimal, trailing zeros of an integer part not counted."""
    return len(Decimal(text).normalize().as_tuple().digits)


def _last_digit_unit(value: Decimal, digits: int) -> Decimal:
    """One unit in the last of ``digits`` significant digits of ``value``."""
    return Decimal(1).scaleb(value.adjusted() - digits + 1)


@given(value=finite, digits=digit_counts)
@example(value=3.00012, digits=4)
@example(value=1e-05, digits=4)
@example(value=5e-324, digits=4)
@example(value=1.7976931348623157e308, digits=1)
@example(value=9.99951, digits=4)
def test_guarantees_never_print_below_the_exact_value(value: float, digits: int) -> None:
    text = format_guarantee(value, digits=digits)
    printed, exact = Decimal(text), Decimal(repr(value))
    assert float(text) >= value and printed >= exact, (value, text)
    assert _significant_digits(text) <= digits and not COMPACT_VIOLATION.search(text), text
    if exact != 0:
        assert printed - exact < _last_digit_unit(exact, digits), (value, text)
    else:
        assert text == "0"


@given(value=finite, digits=digit_counts)
@example(value=1.83186, digits=4)
@example(value=1e-05, digits=4)
@example(value=-3.00012, digits=4)
@example(value=-1.7976931348623157e308, digits=1)
def test_remaining_budgets_never_print_above_the_exact_value(value: float, digits: int) -> None:
    text = format_remaining(value, digits=digits)
    printed, exact = Decimal(text), Decimal(repr(value))
    assert float(text) <= value and printed <= exact, (value, text)
    assert _significant_digits(text) <= digits and not COMPACT_VIOLATION.search(text), text
    if exact != 0:
        assert exact - printed < _last_digit_unit(exact, digits), (value, text)


@given(value=finite, digits=digit_counts)
def test_up_and_down_agree_exactly_when_the_value_has_few_digits(value: float, digits: int) -> None:
    up = round_significant(value, digits=digits, direction="up")
    down = round_significant(value, digits=digits, direction="down")
    assert down <= Decimal(repr(value)) <= up
    assert float(down) <= value <= float(up)
    assert (up == down) == (Decimal(repr(value)) == up)


@given(mantissa=st.integers(min_value=-9999, max_value=9999), exponent=st.integers(min_value=-30, max_value=30))
def test_values_with_few_binary_digits_print_exactly(mantissa: int, exponent: int) -> None:
    value = math.ldexp(mantissa, exponent)
    if len(Decimal(repr(value)).normalize().as_tuple().digits) <= 4:
        assert Decimal(format_guarantee(value)) == Decimal(repr(value)) == Decimal(format_remaining(value))


def test_the_examples() -> None:
    assert format_guarantee(3.00012) == "3.001"
    assert format_remaining(1.83186) == "1.831"
    assert format_guarantee(1.83186) == "1.832"
    assert format_guarantee(4.0) == format_remaining(4.0) == "4"
    assert format_guarantee(8) == "8" and format_guarantee(0.5) == "0.5" and format_guarantee(0.0) == "0"
    assert format_remaining(1e-05) == "1e-05"  # %g's exponent form
    assert format_guarantee(1e-05) == "1e-05"  # a declared δ prints as it was typed
    assert format_guarantee(0.1) == format_remaining(0.1) == "0.1"
    assert format_guarantee(12345.0) == "1.235e+04" and format_remaining(12345.0) == "1.234e+04"
    assert format_guarantee(9.99951) == "10"
    assert format_guarantee(3.00012, digits=6) == "3.00012"


def test_missing_and_non_finite_values_are_spelled_out() -> None:
    assert format_guarantee(None) == format_remaining(None) == "—"
    assert format_guarantee(math.nan) == "nan"
    assert format_guarantee(math.inf) == format_remaining(math.inf) == "inf"
    assert format_remaining(-math.inf) == "-inf"
    with pytest.raises(ValueError):
        round_significant(math.inf, digits=4, direction="up")
    with pytest.raises(ValueError):
        round_significant(1.0, digits=0, direction="up")


def test_the_reports_guarantee_sentence_rounds_the_charged_epsilon_up() -> None:
    """kernel/reporting/privacy_report.py states the job's committed (ε, δ), and for a run that stopped early the
    reservation it released; nearest rounding printed ε = 3.00012 as ``3``."""
    from tests.report_fixtures import small_report

    report = small_report(epsilon_ledger=3.00012, steps_planned=20)
    sentence, committed = report["guarantee"], report["epsilon"]["ledger"]
    assert sentence.startswith(f"({format_guarantee(committed)}, 1e-05)-differential privacy for one row"), sentence
    epsilon, delta = sentence[1:].split(")")[0].split(", ")
    assert float(epsilon) >= committed and float(delta) >= 1e-05
    assert (
        "ran 10 of 20 steps" in sentence
        and "(it had reserved ε 3.001), the rest of the reservation was released" in sentence
    )
