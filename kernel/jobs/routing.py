"""Which worker queue a job goes to: what it asks for, else what its model's size needs.

Why: GPU workers and CPU workers consume different queues, so a small job (a logistic regression,
a small MLP) never waits in line behind GPU jobs, and a large one never lands on a CPU worker. A job
may name a queue class the service offers (``resources.queue``, e.g. ``gpu-h100``); otherwise a model
with at most ``PRIVTRAIN_CPU_JOB_MAX_PARAMETERS`` trainable parameters goes to the CPU queue and
every other model to the GPU queue. The queue is a public scheduling fact, fixed at admission.
"""

from __future__ import annotations

from kernel.config import Settings
from kernel.datasets.facts import DatasetFacts
from kernel.errors import InvalidInput
from kernel.jobs.planning import JobPlan
from kernel.model_catalogue import get_model
from kernel.schemas.jobs import JobCreate
from kernel.schemas.stored_spec import stored_spec

__all__ = ["route_job"]


def route_job(spec: JobCreate, plan: JobPlan, facts: DatasetFacts, settings: Settings) -> str:
    """The job's queue; InvalidInput (422 unknown-queue) for a queue the service does not offer."""
    asked = spec.resources.queue if spec.resources is not None else None
    if asked is not None:
        if asked not in settings.queue_names:
            raise InvalidInput(
                slug="unknown-queue",
                detail=f"resources.queue: this service runs the queues {', '.join(settings.queue_names)}, "
                f"not {asked!r}; leave it out to let the model's size decide",
            )
        return asked
    parameters = get_model(plan.model_name).parameter_count(stored_spec(plan).model.params, facts)
    return settings.cpu_queue if parameters <= settings.cpu_job_max_parameters else settings.task_queue
