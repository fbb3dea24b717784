"""Directed rounding for printed privacy figures (standard library only).

Why: nearest rounding can print a privacy guarantee smaller than the one that holds (ε = 3.00012
printed as ``3`` overstates the privacy) and a remaining budget larger than the one left. So an ε
or δ that states a *guarantee* (spent, charged, reserved, committed, a job's ε or δ) is rounded
toward +∞ and one that states a *remaining* budget (remaining ε, capacity, largest admissible ε)
toward −∞: the printed figure, read back as a float, is then never on the wrong side of the float
that was computed.

Rounding starts from the float's shortest round-trip decimal (``repr``), not from its exact binary
expansion: the two differ by less than half a unit in the last place, far below the outward
rounding every computed ε already carries (``kernel.privacy.rounding``), and a declared δ = 1e-05
must print as ``1e-05``, not ``1.001e-05``. The exact property is stated in float space:
``float(format_guarantee(x)) >= x`` and ``float(format_remaining(x)) <= x`` for every finite x.

Kept free of third-party imports because both the light client package (``privtrain``) and the
API (``app``) print these figures with the same rule.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext
from typing import Literal

Direction = Literal["up", "down"]

MISSING = "—"
"""What a missing figure (None) prints as."""

_ROUNDING = {"up": ROUND_CEILING, "down": ROUND_FLOOR}


def round_significant(value: float, *, digits: int, direction: Direction) -> Decimal:
    """``value`` rounded to ``digits`` significant digits toward +∞ ("up") or −∞ ("down").

    Works on the float's shortest round-trip decimal (``repr``), so a value that already has at
    most ``digits`` significant digits prints unchanged, and ``float(result)`` is ≥ (resp. ≤) the
    float itself (``float`` is monotone and maps the repr back to the same float). Non-finite
    values have no significant digits to round and are refused (the formatters print them).
    """
    if digits < 1:
        raise ValueError(f"digits must be at least 1, not {digits}")
    if direction not in _ROUNDING:
        raise ValueError(f"direction must be 'up' or 'down', not {direction!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a real number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cannot round a non-finite value ({value!r}) to significant digits")
    exact = Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)
    if exact.is_zero():
        return Decimal(0)
    quantum = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    with localcontext() as context:
        # the quantized coefficient has at most digits + 1 digits (9.99… up to 10.0…)
        context.prec = digits + 2
        context.Emax, context.Emin = 999_999, -999_999
        rounded = exact.quantize(quantum, rounding=_ROUNDING[direction])
        return rounded.normalize()


def _compact(number: Decimal, *, digits: int) -> str:
    """Like ``%.{digits}g``: no trailing zeros, exponent form outside 1e-4 ≤ |x| < 10**digits."""
    if number.is_zero():
        return "0"
    sign = "-" if number.is_signed() else ""
    number = abs(number)
    exponent = number.adjusted()
    if -4 <= exponent < digits:
        return sign + format(number, "f")
    coefficient = "".join(map(str, number.as_tuple().digits)).rstrip("0") or "0"
    mantissa = coefficient[0] + ("." + coefficient[1:] if len(coefficient) > 1 else "")
    return f"{sign}{mantissa}e{exponent:+03d}"


def format_directed(value: float | None, *, digits: int, direction: Direction) -> str:
    """Compact text of ``value`` rounded toward ``direction``; None, NaN and ±inf spelled out."""
    if value is None:
        return MISSING
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return _compact(round_significant(value, digits=digits, direction=direction), digits=digits)


def format_guarantee(value: float | None, *, digits: int = 4) -> str:
    """An ε or δ that states a guarantee (spent, charged, reserved, committed): rounded toward
    +∞, so the printed figure never claims more privacy than holds."""
    return format_directed(value, digits=digits, direction="up")


def format_remaining(value: float | None, *, digits: int = 4) -> str:
    """An ε that states a remaining budget (remaining, capacity, largest admissible): rounded
    toward −∞, so the printed figure never promises budget that is not there."""
    return format_directed(value, digits=digits, direction="down")
