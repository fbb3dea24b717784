"""Where job progress comes from: one small, replaceable function.

A progress source yields :class:`JobProgress` snapshots until the job is terminal. The default
polls the JSON events endpoint and the job; a Server-Sent-Events source can replace it with the
same signature, and ``Client.wait(progress_source=...)`` / ``privtrain jobs watch`` take it as is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from privtrain.progress import JobProgress

if TYPE_CHECKING:
    from privtrain.client import Client


class ProgressSource(Protocol):
    def __call__(self, client: Client, job_id: str, *, poll_interval: float) -> Iterator[JobProgress]: ...


def poll_progress(client: Client, job_id: str, *, poll_interval: float) -> Iterator[JobProgress]:
    """Poll the job, then its new events; ε spent is the latest event that reports it.

    The job is read before the events, so the events seen always include the one that moved the
    job to the state seen (a terminal snapshot carries its final ε).
    """
    after = 0
    epsilon_spent: float | None = None
    while True:
        job = client.get_job(job_id)
        for event in client.events(job_id, after=after):
            after = event.seq
            if "epsilon_spent" in event.payload:
                epsilon_spent = float(event.payload["epsilon_spent"])
        yield JobProgress(job=job, epsilon_spent=epsilon_spent)
        if job.is_terminal:
            return
        client.sleep(poll_interval)
