"""The algorithm catalogue: what each algorithm's hyperparameters are and what a job costs.

Torch-free on purpose: the API computes and reserves a job's privacy cost before any worker sees
the data; the worker looks up its implementation by the same name.
"""

from app.algorithms import baselines as _baselines  # noqa: F401
from app.algorithms import dc_dpsgd as _dc_dpsgd  # noqa: F401  (registers "dc-dpsgd", "dc-dpsgd-threshold")
from app.algorithms import dicesgd as _dicesgd  # noqa: F401  (registers "dicesgd", "dicesgd-adam", "dicesgd-auto")
from app.algorithms import dp_sgd as _dp_sgd  # noqa: F401  (registers "dp-sgd")
from app.algorithms import ht_dpsco as _ht_dpsco  # noqa: F401  (registers "ht-dp-fw", "ht-private-lasso", "ht-sparse-linreg", "ht-sparse-opt")
from app.algorithms import kl_family as _kl_family  # noqa: F401  (registers "kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point")
from app.algorithms import non_private as _non_private  # noqa: F401  (registers "sgd", "adam")
from app.algorithms.errors import MissingTrainingFields, UnusedTrainingField
from app.algorithms.registry import (
    ALGORITHMS,
    AlgorithmDefinition,
    InvalidHyperparameters,
    PrivacyPlan,
    UnknownAlgorithm,
    get_algorithm,
    register_algorithm,
)

__all__ = [
    "ALGORITHMS",
    "AlgorithmDefinition",
    "InvalidHyperparameters",
    "MissingTrainingFields",
    "PrivacyPlan",
    "UnknownAlgorithm",
    "UnusedTrainingField",
    "get_algorithm",
    "register_algorithm",
]
