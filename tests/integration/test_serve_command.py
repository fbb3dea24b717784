"""`privtrain-admin serve` (what `make run` starts): API + worker up, key printed, Ctrl-C or SIGTERM
(a container stop) stops both."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children(pid: int) -> list[int]:
    result = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(line) for line in result.stdout.split()]


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_runs_api_and_worker_and_stops_on_a_signal(tmp_path: Path, stop_signal: int) -> None:
    port = _free_port()
    env = {**os.environ, "PRIVTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("PRIVTRAIN_DATABASE_URL", None)
    env.pop("PRIVTRAIN_BROKER_URL", None)
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        key_file = tmp_path / "data" / "api-key"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            pytest.fail((tmp_path / "serve.log").read_text()[-3000:])
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = key_file.read_text().strip()
        assert key in (tmp_path / "serve.log").read_text()  # printed at start
        response = httpx.get(f"http://127.0.0.1:{port}/v1/datasets", headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200
        workers = _children(process.pid)
        assert workers, "no worker process was started"
        process.send_signal(stop_signal)
        assert process.wait(timeout=60) == 0
        time.sleep(0.5)
        assert all(not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower() for pid in workers)
        assert not (tmp_path / "control").exists()  # nothing written outside the data dir
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
