"""`privtrain-admin serve` (what `make run` starts): API + worker up, key printed, Ctrl-C or SIGTERM
(a container stop) stops both, and a SIGKILLed serve leaves no orphaned worker behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


WORKER_GONE_WITHIN_S = 15


def _children(pid: int) -> list[int]:
    result = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(line) for line in result.stdout.split()]


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: nothing of it runs; reaping is its new parent's business)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in status.read_text().lower()
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], *, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
        time.sleep(0.2)
    return [pid for pid in pids if not _gone(pid)]


def _start_serve(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, BinaryIO]:
    """serve on a free port, answering /healthz; (process, port, its log file)."""
    port = _free_port()
    env = {**os.environ, "PRIVTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("PRIVTRAIN_DATABASE_URL", None)
    env.pop("PRIVTRAIN_BROKER_URL", None)
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "admin.cli", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process, port, log
        except httpx.TransportError:
            time.sleep(0.3)
    process.kill()
    log.close()
    pytest.fail((tmp_path / "serve.log").read_text()[-3000:])


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_runs_api_and_worker_and_stops_on_a_signal(tmp_path: Path, stop_signal: int) -> None:
    process, port, log = _start_serve(tmp_path)
    try:
        key_file = tmp_path / "data" / "api-key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = key_file.read_text().strip()
        assert key in (tmp_path / "serve.log").read_text()  # printed at start
        response = httpx.get(f"http://127.0.0.1:{port}/v1/datasets", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200
        workers = _children(process.pid)
        assert workers, "no worker process was started"
        process.send_signal(stop_signal)
        assert process.wait(timeout=60) == 0
        assert _wait_gone(workers, within_s=0.5) == []
        assert not (tmp_path / "control").exists()  # nothing written outside the data dir
    finally:
        if process.poll() is None:
            process.kill()
        log.close()


def test_a_sigkilled_serve_takes_its_worker_with_it(tmp_path: Path) -> None:
    """SIGKILL gives serve no chance to stop its worker: the kernel's parent-death signal (and the
    worker's own watch of its parent pid) must end it, or it would keep taking jobs unseen."""
    process, _port, log = _start_serve(tmp_path)
    workers: list[int] = []
    try:
        workers = _children(process.pid)
        assert workers, "no worker process was started"
        deadline = time.monotonic() + 60  # killed only once the worker runs (its watch started)
        while b"ready" not in (tmp_path / "serve.log").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.3)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert _wait_gone(workers, within_s=WORKER_GONE_WITHIN_S) == [], (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        for pid in workers:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
        log.close()


_ORPHAN_PARENT = """
import os, subprocess, sys, time
from worker.parent_watch import PARENT_PID_ENV
env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
child = subprocess.Popen([sys.executable, "-c",
    "import time; from worker.parent_watch import start_from_environment; "
    "assert start_from_environment(interval_s=0.2) is not None; print('watching', flush=True); time.sleep(600)"],
    env=env, stdout=subprocess.PIPE)
assert child.stdout.readline().strip() == b"watching"
print(child.pid, flush=True)
time.sleep(600)
"""


def test_the_parent_watch_alone_stops_an_orphan(tmp_path: Path) -> None:
    """The portable layer on its own (no prctl: the child is started plainly): SIGKILL the parent
    and the child, a plain sleeper with the watch, is SIGTERMed and exits."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_PARENT], cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone([child], within_s=WORKER_GONE_WITHIN_S) == []
    finally:
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


_WORKER_PARENT = """
import os, subprocess, sys, time
from admin.cli import worker_command
from kernel.parent_death import PARENT_PID_ENV
env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
worker = subprocess.Popen(worker_command("fuzz-queue"), env=env, start_new_session=True)  # no prctl here
print(worker.pid, flush=True)
time.sleep(600)
"""


def test_the_real_worker_watches_its_parent_without_prctl(tmp_path: Path) -> None:
    """The Celery worker as serve starts it, minus the prctl layer: once running, it notices its
    parent is gone and stops on its own."""
    env = {**os.environ, "PRIVTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("PRIVTRAIN_DATABASE_URL", None)
    env.pop("PRIVTRAIN_BROKER_URL", None)
    log = (tmp_path / "worker.log").open("wb")
    parent = subprocess.Popen(
        [sys.executable, "-c", _WORKER_PARENT],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    worker = 0
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        deadline = time.monotonic() + 90
        while b"ready" not in (tmp_path / "worker.log").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not _gone(worker), (tmp_path / "worker.log").read_text()[-3000:]
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone([worker], within_s=WORKER_GONE_WITHIN_S) == [], (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        if worker and not _gone(worker):
            os.kill(worker, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
        log.close()
