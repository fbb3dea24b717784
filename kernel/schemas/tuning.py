"""Private hyperparameter tuning requests and views (docs/tuning.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from kernel.schemas.jobs import InitChainEstimate, JobCreate
from kernel.schemas.renamed import WithRenamedFields, deprecated_alias
from kernel.schemas.types import UtcDateTime

Scalar = float | int | Annotated[str, StringConstraints(max_length=200)] | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SearchRange(_Strict):
    """A numeric range: values drawn uniformly (or log-uniformly) between low and high; integer
    fields (batch size, epochs, steps, ...) take the nearest integer."""

    low: float = Field(ge=-1e12, le=1e12)
    high: float = Field(ge=-1e12, le=1e12)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> SearchRange:
        if not self.low < self.high:
            raise ValueError("low must be below high")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        return self


class TrialsSpec(_Strict):
    """How many trials run: a random number K the server draws, never the client; only the best
    trial is released, and K itself is never shown (the guarantee depends on it staying secret)."""

    distribution: Literal["truncated-negative-binomial", "poisson"] = "truncated-negative-binomial"
    mean: float = Field(gt=1, le=100, description="E[K], the expected number of trials")
    eta: float | None = Field(
        default=None,
        gt=-1,
        le=10,
        description="truncated-negative-binomial only: its shape η (default 0: the logarithmic distribution; "
        "1: the geometric one)",
    )
    maximum: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="the public maximum of K: K is drawn from the distribution conditioned on K <= maximum, and "
        "the tuning runs in this many slots of worker time whatever K is (at most the service's "
        "PRIVTRAIN_TUNING_MAX_TRIALS; default: the smallest maximum that keeps 99% of E[K], which adds at most "
        "about 0.01 to the tuning's RDP)",
    )

    @model_validator(mode="after")
    def _eta_for_tnb(self) -> TrialsSpec:
        if self.distribution == "poisson" and self.eta is not None:
            raise ValueError("eta applies to the truncated-negative-binomial distribution only")
        return self


class SelectionSpec(_Strict):
    metric: Literal["accuracy", "mse", "perplexity"] = Field(
        description="the DP hold-out metric of the base's evaluation block: accuracy is maximised, mse and "
        "perplexity minimised"
    )


class TuningCreate(_Strict):
    base: JobCreate = Field(description="a job spec; every trial is this spec with the searched fields set")
    search_space: dict[str, list[Scalar] | SearchRange] = Field(
        min_length=1,
        max_length=8,
        description='dotted fields of the base spec and their candidate values, e.g. {"training.learning_rate": '
        '{"low": 0.01, "high": 1, "log": true}, "algorithm.hyperparameters.clipping_norm": [0.5, 1, 2]}',
    )
    trials: TrialsSpec
    selection: SelectionSpec
    candidates: int = Field(
        default=16,
        ge=1,
        le=32,
        description="how many configurations are drawn from the search space when it has ranges, or is a grid "
        "larger than this; each trial runs one of them, chosen at random",
    )


class TuningTrials(BaseModel):
    distribution: str
    parameters: dict[str, float]
    expected: float = Field(description="E[K], the expected number of trials (with K at most its maximum)")
    maximum: int | None = Field(
        default=None, description="the public maximum of K (None for tunings admitted before maximums existed)"
    )
    count_shown: bool = Field(
        default=False,
        description="always false: the number of trials drawn, and how many have run, are never shown",
    )


class TuningSchedule(BaseModel):
    """When a tuning runs: public, fixed at admission, the same whatever number of trials is drawn."""

    slots: int = Field(description="one slot of worker time per possible trial: the trials' public maximum")
    slots_done: int = Field(description="slots finished so far (each lasts slot_seconds, with or without a trial)")
    trial_time_limit_s: float = Field(description="a trial still training after this long releases nothing")
    slot_seconds: float = Field(description="how long every slot takes: the trial time limit plus a margin")
    parallel_slots: int = Field(description="at most this many of the tuning's slots run at a time")
    worker_seconds: float = Field(description="the worker time all slots take together: slots × slot_seconds")


class TuningOut(WithRenamedFields):
    id: str
    dataset_id: str
    status: str = Field(description="the status of the tuning (queued, running, succeeded, failed, cancelled)")
    job_id: str = Field(description="the job that runs the trials and, when done, holds the selected model")
    best_job_id: str | None = Field(
        description="when succeeded: an ordinary job with the selected model, its hyperparameters, its DP "
        "metric and a report of the tuning's guarantee"
    )
    selected: dict[str, Any] | None = Field(
        default=None, description="when succeeded: the released trial's configuration (searched fields and values)"
    )
    selected_metric: float | None = Field(
        default=None, description="when succeeded: the released trial's DP hold-out metric (noisy by design)"
    )
    error_code: str | None = Field(
        default=None,
        description="why it failed, e.g. no-trials-drawn (a Poisson number of trials can be 0: nothing is released)",
    )
    selection: dict[str, Any]
    trials: TuningTrials
    search_space: dict[str, Any]
    candidates: list[dict[str, Any]] = Field(
        description="the configurations the trials choose from (public: drawn without looking at the data), "
        "each with its per-trial noise, steps and ε"
    )
    schedule: TuningSchedule | None = Field(
        default=None, description="the tuning's slots (None for tunings admitted before slots existed)"
    )
    epsilon_reserved: float = Field(description="what the whole tuning reserves, at δ: one ledger entry")
    epsilon_ledger: float = deprecated_alias("epsilon_ledger")
    epsilon_committed: float | None = Field(
        default=None, description="what it committed once ended (the whole reservation, however it ended)"
    )
    epsilon_one_trial: float = Field(description="the costliest configuration, run once as an ordinary job")
    epsilon_separate_jobs: float = Field(
        description="what running E[K] trials (rounded up) as separate jobs of the costliest candidate would be "
        "charged, for comparison"
    )
    delta: float
    created_at: UtcDateTime
    links: dict[str, str]


class TuningEstimate(WithRenamedFields):
    epsilon_reserved: float = Field(description="what the whole tuning would reserve, at δ: one ledger entry")
    epsilon_ledger: float = deprecated_alias("epsilon_ledger")
    epsilon_separate_jobs: float
    epsilon_one_trial: float = Field(description="the costliest candidate run once as an ordinary job")
    delta: float
    admissible: bool
    budget_remaining_epsilon: float | None
    candidates: list[dict[str, Any]]
    trials: TuningTrials
    schedule: TuningSchedule
    init_chain: InitChainEstimate | None = Field(
        default=None,
        description="when the base starts from a job's model trained on these rows: the warning that the tuning "
        "would use them again, with the composed ε of the released model's guarantee",
    )


class TuningList(BaseModel):
    items: list[TuningOut]
    next_cursor: str | None
