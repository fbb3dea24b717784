"""Torch-free privacy math for privtrain: events, RDP curves, the Rényi filter, calibration, PRV and
the tight single-job ε of the report.

Every number produced here is meant to be a true upper bound on privacy loss (docs/privacy-model.md): costs
and epsilons are rounded up, capacities down (see :mod:`app.privacy.rounding`).
"""

from app.privacy.budget_filter import admission_order, remaining_epsilon
from app.privacy.calibration import calibrate_noise_multiplier
from app.privacy.conversion import capacity_curve, epsilon_from_rdp, ledger_epsilon
from app.privacy.curves import add_curves, subtract_curves
from app.privacy.errors import CalibrationError, PrivacyEventError
from app.privacy.event_json import EVENT_SCHEMA, EVENT_SCHEMA_VERSION, event_from_json, event_to_json
from app.privacy.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    ZCDPEvent,
)
from app.privacy.orders import ORDERS, ORDERS_VERSION
from app.privacy.prv import prv_epsilon
from app.privacy.rdp import rdp_curve
from app.privacy.single_job import SingleJobEpsilon, capped_single_job_epsilon, single_job_epsilon
from app.privacy.versions import ACCOUNTANT_NAME, ACCOUNTANT_VERSION

__all__ = [
    "ACCOUNTANT_NAME",
    "ACCOUNTANT_VERSION",
    "EVENT_SCHEMA",
    "EVENT_SCHEMA_VERSION",
    "ORDERS",
    "ORDERS_VERSION",
    "CalibrationError",
    "ComposedEvent",
    "ExponentialMechanismEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "PoissonSampledGaussianEvent",
    "PrivacyEvent",
    "PrivacyEventError",
    "PureDPEvent",
    "SingleJobEpsilon",
    "ZCDPEvent",
    "add_curves",
    "admission_order",
    "calibrate_noise_multiplier",
    "capacity_curve",
    "capped_single_job_epsilon",
    "epsilon_from_rdp",
    "event_from_json",
    "event_to_json",
    "ledger_epsilon",
    "prv_epsilon",
    "rdp_curve",
    "remaining_epsilon",
    "single_job_epsilon",
    "subtract_curves",
]
