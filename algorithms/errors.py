"""Domain errors of the catalogue; kernel/jobs/planning.py turns them into 422 problems."""

from __future__ import annotations


class InvalidHyperparameters(ValueError):
    """The spec's hyperparameters (or the training fields an algorithm reads) do not fit it."""


class UnusedTrainingField(InvalidHyperparameters):
    """A training.* field the algorithm does not read was given: refused, never ignored."""


class MissingTrainingFields(ValueError):
    """training.* fields the algorithm reads were left out (the spec's own missing-field error)."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        super().__init__(", ".join(f"training.{field}: Field required" for field in fields))
        self.fields = fields
