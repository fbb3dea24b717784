"""Names and versions stored with every ledger entry so that a curve can be re-derived later."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Final

from kernel.privacy.orders import ORDERS_VERSION


def _prv_accountant_version() -> str:
    try:
        return version("prv-accountant")
    except PackageNotFoundError:  # pragma: no cover - it is a hard dependency
        return "unknown"


ACCOUNTANT_NAME: Final[str] = "privtrain-rdp"
# Bump the leading number whenever a formula, a margin or the rounding rule changes.
ACCOUNTANT_VERSION: Final[str] = f"1.0 ({ORDERS_VERSION}; prv-accountant {_prv_accountant_version()})"
