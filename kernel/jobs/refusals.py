"""The refusals of job admission and cancellation, as domain errors (HTTP problems at the API edge)."""

from __future__ import annotations

from kernel.db.orm import Job, PrivacyBudget
from kernel.errors import Conflict, LimitReached
from privtrain_common.directed_rounding import format_guarantee, format_remaining

__all__ = ["ACTIVE_JOBS_RETRY_AFTER_S", "ActiveJobLimitReached", "BudgetExhausted", "JobNotCancellable"]

ACTIVE_JOBS_RETRY_AFTER_S = 30


class BudgetExhausted(Conflict):
    """The filter refused the job: its worst case does not fit what remains. Nothing was written."""

    def __init__(self, *, job: Job, budget: PrivacyBudget, remaining_epsilon: float) -> None:
        super().__init__(
            slug="insufficient-privacy-budget",
            detail=(
                # the cost is a guarantee (rounded up), what remains is rounded down
                f"the job costs ε = {format_guarantee(job.epsilon_ledger)} at "
                f"δ = {format_guarantee(job.delta)} and does not fit the dataset's "
                f"remaining budget of ε = {format_remaining(remaining_epsilon)}"
            ),
            extra={
                "remaining_epsilon": remaining_epsilon,
                "job_epsilon": job.epsilon_ledger,
                "budget_epsilon": budget.epsilon,
                "budget_delta": budget.delta,
            },
        )
        self.dataset_id = budget.dataset_id  # read now: the row is detached once the transaction ends

    def with_largest_admissible(self, largest_admissible_epsilon: float | None) -> BudgetExhausted:
        """This refusal, naming the largest target ε a job of this shape is admitted at now (what
        the estimate calls ``largest_admissible_epsilon``; more than what remains for a subsampled job)."""
        if largest_admissible_epsilon is not None:
            self.detail = (
                f"{self.detail}; the largest target ε this job could ask for and be admitted now is "
                f"{format_remaining(largest_admissible_epsilon)}"
            )
            self.args = (self.detail,)
        self.extra = {**self.extra, "largest_admissible_epsilon": largest_admissible_epsilon}
        return self


class ActiveJobLimitReached(LimitReached):
    """The tenant already has as many queued and running jobs as it may."""

    def __init__(self, *, active: int, limit: int) -> None:
        super().__init__(
            slug="too-many-active-jobs",
            detail=f"this tenant already has {active} queued or running jobs (limit {limit}); "
            "wait for some to finish or cancel one",
            extra={"active_jobs": active, "limit": limit},
            retry_after_s=ACTIVE_JOBS_RETRY_AFTER_S,
        )


class JobNotCancellable(Conflict):
    """The job has already ended (``job_status`` says how)."""

    def __init__(self, job_status: str) -> None:
        super().__init__(slug="job-not-cancellable", detail=f"the job is already {job_status}")
        self.job_status = job_status
