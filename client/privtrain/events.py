"""Where job progress comes from: one small, replaceable function.

A progress source yields :class:`JobProgress` snapshots until the job is terminal. The default
polls the JSON events endpoint and the job; a Server-Sent-Events source can replace it with the
same signature, and ``Client.wait(progress_source=...)`` / ``privtrain jobs watch`` take it as is.
A source reads through :class:`JobFeed`, which :class:`privtrain.Client` is (so this module
needs nothing of the client).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Protocol

from privtrain.progress import JobProgress
from privtrain.resources import Job, JobEvent


class JobFeed(Protocol):
    """What a progress source reads: the job, its events (pages or a stream) and a pause."""

    sleep: Callable[[float], None]

    def get_job(self, job_id: str) -> Job: ...

    def list_events(self, job_id: str, *, after: int = 0) -> list[JobEvent]: ...

    def stream_events(self, job_id: str, *, after: int = 0) -> Generator[JobEvent, None, None]: ...


class ProgressSource(Protocol):
    def __call__(self, client: JobFeed, job_id: str, *, poll_interval: float) -> Iterator[JobProgress]: ...


def poll_progress(client: JobFeed, job_id: str, *, poll_interval: float) -> Iterator[JobProgress]:
    """Poll the job, then its new events; ε spent is the latest event that reports it.

    The job is read before the events, so the events seen always include the one that moved the
    job to the state seen (a terminal snapshot carries its final ε).
    """
    after = 0
    epsilon_spent: float | None = None
    while True:
        job = client.get_job(job_id)
        for event in client.list_events(job_id, after=after):
            after = event.seq
            if "epsilon_spent" in event.payload:
                epsilon_spent = float(event.payload["epsilon_spent"])
        yield JobProgress(job=job, epsilon_spent=epsilon_spent)
        if job.is_terminal:
            return
        client.sleep(poll_interval)
