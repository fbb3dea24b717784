"""The algorithm catalogue: what each algorithm's hyperparameters are and what a job costs.

Torch-free on purpose: the API computes and reserves a job's privacy cost before any worker sees
the data; the worker looks up its implementation by the same name (algorithms.trainers). Which
families exist is algorithms/catalogue.py's one list; importing this package registers them all.
"""

from algorithms.catalogue import load_definitions
from algorithms.errors import MissingTrainingFields, UnusedTrainingField
from algorithms.registry import (
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

load_definitions()
