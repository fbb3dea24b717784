"""An S3-compatible object store for tests: moto's server in its own process, on a free port.

A real process (not an in-memory mock) so that clients talk HTTP to it as they would to MinIO or
AWS, and so that an outage can be staged by stopping it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3
import pytest

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "privtrain-tests",
    "AWS_SECRET_ACCESS_KEY": "privtrain-tests",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ObjectStoreServer:
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the object store server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def client(self) -> S3Client:
        return boto3.client("s3", endpoint_url=self.endpoint, **_lower(CREDENTIALS))


def _lower(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
        "region_name": credentials["AWS_DEFAULT_REGION"],
    }


@pytest.fixture(scope="session")
def object_store_server() -> Iterator[ObjectStoreServer]:
    server = ObjectStoreServer(port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(object_store_server: ObjectStoreServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the test server; the AWS environment points boto3 at it. Returns
    ``s3://bucket/prefix`` for PRIVTRAIN_STORAGE_URL."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", object_store_server.endpoint)
    bucket = f"privtrain-{uuid.uuid4().hex[:12]}"
    object_store_server.client().create_bucket(Bucket=bucket)
    return f"s3://{bucket}/blobs"
