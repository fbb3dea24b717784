"""Torch-free privacy math for privtrain: events, RDP curves, the Rényi filter, calibration, PRV,
the tight single-job ε of the report, and private hyperparameter tuning.

Every number produced here is meant to be a true upper bound on privacy loss (docs/privacy-model.md): costs
and epsilons are rounded up, capacities down (see :mod:`app.privacy.rounding`).
"""

from app.privacy.budget_filter import admission_order, remaining_epsilon
from app.privacy.calibration import calibrate_noise_multiplier
from app.privacy.chain_composition import ComposedGuarantee, compose_guarantee, summed_curve
from app.privacy.conversion import capacity_curve, epsilon_from_rdp, ledger_epsilon
from app.privacy.curves import add_curves, subtract_curves
from app.privacy.errors import CalibrationError, PrivacyEventError
from app.privacy.event_json import EVENT_SCHEMA, EVENT_SCHEMA_VERSION, event_from_json, event_to_json
from app.privacy.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    HyperparameterTuningEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PoissonTrials,
    PrivacyEvent,
    PureDPEvent,
    TrialDistribution,
    TruncatedNegativeBinomial,
    ZCDPEvent,
)
from app.privacy.orders import ORDERS, ORDERS_VERSION
from app.privacy.prv import prv_epsilon
from app.privacy.rdp import rdp_curve
from app.privacy.single_job import SingleJobEpsilon, capped_single_job_epsilon, single_job_epsilon
from app.privacy.tuning import (
    expected_trials,
    sample_trial_count,
    trial_count_probability,
    truncated_negative_binomial_for_mean,
    tuned_curve,
)
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
    "ComposedGuarantee",
    "ExponentialMechanismEvent",
    "GaussianEvent",
    "HyperparameterTuningEvent",
    "LaplaceEvent",
    "PoissonSampledGaussianEvent",
    "PoissonTrials",
    "PrivacyEvent",
    "PrivacyEventError",
    "PureDPEvent",
    "SingleJobEpsilon",
    "TrialDistribution",
    "TruncatedNegativeBinomial",
    "ZCDPEvent",
    "add_curves",
    "admission_order",
    "calibrate_noise_multiplier",
    "capacity_curve",
    "capped_single_job_epsilon",
    "compose_guarantee",
    "epsilon_from_rdp",
    "event_from_json",
    "event_to_json",
    "expected_trials",
    "ledger_epsilon",
    "prv_epsilon",
    "rdp_curve",
    "remaining_epsilon",
    "sample_trial_count",
    "single_job_epsilon",
    "subtract_curves",
    "summed_curve",
    "trial_count_probability",
    "truncated_negative_binomial_for_mean",
    "tuned_curve",
]
