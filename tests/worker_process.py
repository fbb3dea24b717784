"""Start a real Celery worker process for integration and service tests (never eager mode)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi.testclient import TestClient

from admin.cli import worker_command
from kernel.config import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent


def crash_recovery_settings(data_dir: Path, **overrides: object) -> Settings:
    """Settings of the tests that SIGKILL a worker mid-job: fast heartbeats and reconciler, a
    checkpoint every 25 steps, a job stale after 4 s, and retries enough for a starved machine."""
    from tests.conftest import make_settings

    values: dict[str, object] = {
        "heartbeat_interval_s": 0.1,
        "checkpoint_every_steps": 25,
        "stale_after_s": 4.0,
        "reconcile_interval_s": 0.3,
        "max_attempts": 4,
    }
    return make_settings(data_dir, **{**values, **overrides})


def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings for a child process, as PRIVTRAIN_* variables."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        env[f"PRIVTRAIN_{name.upper()}"] = text
    env["PRIVTRAIN_DATABASE_URL"] = settings.resolved_database_url
    return env


@contextmanager
def running_worker(settings: Settings, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            worker_command(settings.consumed_queues), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def kill_worker_mid_job(
    settings: Settings, client: TestClient, job_id: str, log_path: Path, *, after_steps: int
) -> None:
    """Start a worker, let it run the job past ``after_steps`` steps, then SIGKILL it: no goodbye,
    the job stays "running" until the reconciler finds it stale."""
    with running_worker(settings, log_path) as worker:
        wait_for_status(client, job_id, {"running"}, log_path=log_path)
        deadline = time.monotonic() + 120
        while client.get(f"/v1/jobs/{job_id}").json()["steps_run"] < after_steps:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.05)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()


def wait_for_status(
    client: TestClient, job_id: str, statuses: set[str], *, timeout_s: float = 240.0, log_path: Path | None = None
) -> dict:
    deadline = time.monotonic() + timeout_s
    job: dict = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.25)
    log = log_path.read_text()[-4000:] if log_path and log_path.exists() else ""
    raise AssertionError(f"job {job_id} stuck in {job.get('status')}; worker log tail:\n{log}")
