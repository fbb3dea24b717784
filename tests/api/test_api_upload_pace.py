"""Uploads must keep sending (idle timeout, minimum rate), and an upload waiting on the database
never stalls the event loop (issue 13: slowloris uploads held for minutes; an upload waiting on
the SQLite write lock froze every route)."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from api.limits.upload_pace import UploadPace, UploadTooSlow, receive_paced
from kernel.bootstrap import migrate
from tests.concurrency_helpers import concurrency_settings, digits_csv, live_server

PACE = UploadPace(idle_timeout_s=0.3, min_rate_bytes_per_s=1000.0, grace_s=0.4)


async def _drip(chunk: bytes, *, every_s: float, count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        await asyncio.sleep(every_s)
        yield chunk


def _receive(chunks: AsyncIterator[bytes], pace: UploadPace = PACE) -> tuple[int, bytes]:
    written = bytearray()
    received = asyncio.run(receive_paced(chunks, written.extend, pace=pace))
    return received, bytes(written)


def test_a_prompt_body_is_copied_whole() -> None:
    async def body() -> AsyncIterator[bytes]:
        for i in range(300):
            yield bytes([i % 256]) * 10_000  # 3 MB: several batched writes

    received, written = _receive(body())
    assert received == 3_000_000
    assert written == b"".join(bytes([i % 256]) * 10_000 for i in range(300))


def test_a_client_that_stops_sending_is_refused_as_idle() -> None:
    async def stalls() -> AsyncIterator[bytes]:
        yield b"x" * 5000
        await asyncio.sleep(5)
        yield b"never"

    started = time.monotonic()
    with pytest.raises(UploadTooSlow) as caught:
        _receive(stalls())
    assert caught.value.reason == "idle" and caught.value.received == 5000
    assert time.monotonic() - started < 2.0


def test_a_trickle_below_the_minimum_rate_is_refused_after_the_grace_period() -> None:
    # 20 bytes every 50 ms = 400 B/s: each chunk beats the idle timeout, the average rate does not.
    started = time.monotonic()
    with pytest.raises(UploadTooSlow) as caught:
        _receive(_drip(b"y" * 20, every_s=0.05, count=1000))
    elapsed = time.monotonic() - started
    assert caught.value.reason == "rate"
    assert PACE.grace_s <= elapsed < 2.0  # cut at the deadline, not when the body would end (50 s)


def test_rate_deadline_grows_with_what_was_received() -> None:
    assert PACE.rate_deadline(started=100.0, received=0) == 100.0 + PACE.grace_s
    assert PACE.rate_deadline(started=100.0, received=5000) == 105.0


def _slow_raw_upload(base_url: str, key: str, *, declared: int, drip_every_s: float) -> bytes:
    """An HTTP/1.1 upload that announces ``declared`` bytes and sends one every ``drip_every_s``;
    returns whatever the server answered before closing."""
    parts = urlsplit(base_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST /v1/datasets?name=slow&format=csv&label_column=label&epsilon=1&delta=1e-5 HTTP/1.1\r\n"
                f"Host: {parts.netloc}\r\nAuthorization: Bearer {key}\r\nContent-Type: text/csv\r\n"
                f"Content-Length: {declared}\r\n\r\n"
            ).encode()
        )
        sock.settimeout(drip_every_s)
        answer = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"1")
            except OSError:
                break  # the server closed the connection
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            answer += data
            if b"\r\n\r\n" in answer and b"upload-too-slow" in answer:
                break
        return answer


def test_a_slowloris_upload_gets_408_and_leaves_no_temp_file(tmp_path: Path) -> None:
    settings = concurrency_settings(
        tmp_path,
        upload_idle_timeout_s=5.0,
        upload_min_rate_bytes_per_s=100.0,
        upload_rate_grace_s=1.0,
    )
    migrate(settings)
    with live_server(settings) as service:
        key = service.tenant_key("slow")
        started = time.monotonic()
        answer = _slow_raw_upload(service.base_url, key, declared=1_000_000, drip_every_s=0.1)
        elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"/problems/upload-too-slow" in answer
        assert elapsed < 10.0
        deadline = time.monotonic() + 5
        while any(settings.tmp_dir.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(settings.tmp_dir.iterdir())
        # The slot was given back: a normal upload by the same tenant still works.
        with service.client(key) as client:
            response = client.post(
                "/v1/datasets",
                content=digits_csv(),
                params={"name": "ok", "format": "csv", "label_column": "label", "epsilon": 1, "delta": 1e-5},
            )
        assert response.status_code == 201, response.text


def test_an_upload_waiting_on_the_database_lock_does_not_stall_other_requests(tmp_path: Path) -> None:
    settings = concurrency_settings(tmp_path)
    migrate(settings)
    db_path = settings.resolved_database_url.removeprefix("sqlite:///")
    with live_server(settings) as service:
        key = service.tenant_key("uploader")
        results: dict[str, httpx.Response] = {}
        with httpx.Client(base_url=service.base_url, timeout=30) as warm:  # first-request costs are not the lock's
            assert warm.get("/healthz").status_code == 200
        locker = sqlite3.connect(db_path, isolation_level=None, timeout=30)
        locker.execute("BEGIN IMMEDIATE")  # another writer holds SQLite's write lock
        try:

            def upload() -> None:
                with service.client(key) as client:
                    results["upload"] = client.post(
                        "/v1/datasets",
                        content=digits_csv(),
                        params={"name": "d", "format": "csv", "label_column": "label", "epsilon": 1, "delta": 1e-5},
                    )

            uploader = threading.Thread(target=upload)
            uploader.start()
            time.sleep(1.0)  # the upload is parsed and now waits for the write lock
            assert "upload" not in results
            latencies = []
            with httpx.Client(base_url=service.base_url, timeout=30) as probe:
                for _ in range(5):
                    started = time.monotonic()
                    assert probe.get("/healthz").status_code == 200
                    latencies.append(time.monotonic() - started)
                    time.sleep(0.2)
            assert "upload" not in results, "the upload was meant to be waiting on the lock"
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        uploader.join(timeout=60)
        assert results["upload"].status_code == 201, results["upload"].text
        assert max(latencies) < 1.0, latencies
