"""Hostile uploads through the API (issue 36): each crafted body or parameter that answered 500 is
a 4xx problem with a stable type and a reason, and leaves nothing stored; an image ZIP's decoding
is bounded before it starts, by a deadline while it runs, and stops when its client leaves, which
frees the tenant's upload slot at once; the worker never opens the ZIP's images again."""

from __future__ import annotations

import io
import socket
import struct
import time
import zipfile
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import ImageFile
from sqlalchemy import func, select

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import BaseModelRecord, Dataset, LedgerEntry, PrivacyBudget, TokenizerRecord
from kernel.ingest import image_zip as image_zip_module
from tests.concurrency_helpers import concurrency_settings, digits_csv, live_server
from tests.conftest import RecordingDispatcher, make_settings, new_key
from tests.text_fixtures import word_level_tokenizer_json
from tests.unit.ingest.image_fixtures import class_images, image_zip, pixel_bomb_zip
from worker.runner import JobRunner

HUGE_INT = "1" * 5000
DEEP = "[" * 5000 + "]" * 5000
BASE_MODEL = {
    "name": "b",
    "architecture": "mlp",
    "params": '{"hidden_sizes": [16]}',
    "input_shape": "64",
    "n_outputs": 10,
}


def _stored(database: Database, settings: Settings) -> tuple[object, ...]:
    """Rows and files a refusal must not change: datasets, budgets, ledger, base models,
    tokenizers, blobs and temp files."""
    with database.read_session() as session:
        counts = tuple(
            session.scalar(select(func.count()).select_from(table)) or 0
            for table in (Dataset, PrivacyBudget, LedgerEntry, BaseModelRecord, TokenizerRecord)
        )
    files = sorted(p for p in settings.blob_dir.rglob("*") if p.is_file())
    temps = sorted(p for p in settings.tmp_dir.rglob("*") if p.is_file()) if settings.tmp_dir.exists() else []
    return (*counts, files, temps)


def _safetensors(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + b"\0" * 16


def _npy(shape: str) -> bytes:
    header = ("{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }").encode("latin1")
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\0" * 64


def _npz_with_features(features: bytes) -> bytes:
    labels = io.BytesIO()
    np.save(labels, np.zeros(2))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("X.npy", features)
        archive.writestr("y.npy", labels.getvalue())
    return buffer.getvalue()


DATASET = {"name": "d", "epsilon": 8, "delta": 1e-5}

CASES = [
    pytest.param(
        "/v1/base-models",
        BASE_MODEL,
        _safetensors(DEEP.encode()),
        (422, "invalid-safetensors", "header-too-deep"),
        id="safetensors-deep",
    ),
    pytest.param(
        "/v1/base-models",
        BASE_MODEL,
        _safetensors(('{"0.weight": {"dtype": "F32", "shape": [' + HUGE_INT + '], "data_offsets": [0, 16]}}').encode()),
        (422, "invalid-safetensors", "header-number-too-long"),
        id="safetensors-huge-int",
    ),
    pytest.param(
        "/v1/base-models",
        BASE_MODEL,
        _safetensors(b'{"0.weight": {"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]}}'),
        (422, "invalid-safetensors", "malformed"),
        id="safetensors-dtype-not-a-string",
    ),
    pytest.param(
        "/v1/base-models",
        BASE_MODEL,
        _safetensors(b'{"0.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 18446744073709551615]}}'),
        (422, "invalid-safetensors", "malformed"),
        id="safetensors-offsets-out-of-range",
    ),
    pytest.param(
        "/v1/base-models",
        {**BASE_MODEL, "params": '{"hidden_sizes": ' + "[" * 5000 + "]" * 5000 + "}"},
        b"never read",
        (422, "invalid-base-model-request", "params-too-deep"),
        id="params-5000-deep",
    ),
    pytest.param(
        "/v1/base-models",
        {**BASE_MODEL, "params": '{"hidden_sizes": [' + HUGE_INT + "]}"},
        b"never read",
        (422, "invalid-base-model-request", "params-number-too-long"),
        id="params-huge-int",
    ),
    pytest.param(
        "/v1/datasets",
        {**DATASET, "format": "jsonl", "max_length": 8},
        b'{"text": "fine", "label": "a"}\n{"text": "a", "label": ' + HUGE_INT.encode() + b"}\n",
        (422, "jsonl-invalid-line", "jsonl-invalid-line"),
        id="jsonl-huge-int",
    ),
    pytest.param(
        "/v1/datasets",
        {**DATASET, "format": "jsonl", "max_length": 8},
        b'{"text": "fine", "label": ' + DEEP.encode() + b"}\n",
        (422, "jsonl-invalid-line", "jsonl-invalid-line"),
        id="jsonl-deep",
    ),
    pytest.param(
        "/v1/datasets",
        {
            **DATASET,
            "format": "csv",
            "label_column": "label",
            "preparation": '{"scale": {"a": {"center": ' + HUGE_INT[:4000] + ', "scale": 1}}}',
        },
        b"a,label\n1,0\n2,1\n",
        (422, "invalid-dataset", "bad-preparation"),
        id="preparation-huge-int",
    ),
    pytest.param(
        "/v1/datasets",
        {**DATASET, "format": "npz"},
        _npz_with_features(_npy("(2, -3)")),
        (422, "invalid-dataset", "invalid-npz"),
        id="npz-negative-shape",
    ),
    pytest.param(
        "/v1/datasets",
        {**DATASET, "format": "zip", "image_size": "8"},
        pixel_bomb_zip(5),
        (422, "invalid-dataset", "pixel-amplification"),
        id="zip-pixel-bomb",
    ),
    pytest.param(
        "/v1/tokenizers",
        {"name": "t"},
        DEEP.encode(),
        (422, "invalid-tokenizer", None),
        id="tokenizer-deep",
    ),
]


@pytest.mark.parametrize(("path", "params", "body", "expected"), CASES)
def test_a_hostile_upload_is_a_4xx_problem_with_a_reason_and_stores_nothing(
    alice: TestClient,
    database: Database,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    params: dict[str, object],
    body: bytes,
    expected: tuple[int, str, str | None],
) -> None:
    decoded: list[object] = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: decoded.append(image) or real_load(image))
    before = _stored(database, settings)
    response = alice.post(path, params=params, content=body)
    status, slug, reason = expected
    assert response.status_code == status, response.text
    problem = response.json()
    assert response.headers["content-type"] == "application/problem+json"
    assert problem["type"] == f"/problems/{slug}" and problem.get("reason") == reason, problem
    assert "11111" not in problem["detail"] and "Traceback" not in response.text
    assert _stored(database, settings) == before
    assert decoded == []  # the pixel bomb was refused from its headers


def test_a_tokenizer_json_over_its_size_limit_is_a_413_before_it_is_read(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", max_tokenizer_bytes=1000)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    headers = {"Authorization": f"Bearer {new_key(database, 'alice')}"}
    body = word_level_tokenizer_json()
    padded = body[:-1] + b', "padding_": "' + b"x" * 1000 + b'"}'
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
        refused = client.post("/v1/tokenizers", params={"name": "t"}, content=padded, headers=headers)
        assert refused.status_code == 413 and refused.json()["type"] == "/problems/payload-too-large", refused.text
        accepted = client.post("/v1/tokenizers", params={"name": "t"}, content=body, headers=headers)
        assert accepted.status_code == 201, accepted.text
    database.dispose()


# ---------------------------------------------------------------- deadline and disconnect


@pytest.fixture
def slow_decoding(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each image takes 50 ms to decode (a stand-in for large images); the times they started."""
    started: list[float] = []
    real = image_zip_module.decode_image

    def slow(data: bytes, **options: object) -> np.ndarray:
        started.append(time.monotonic())
        time.sleep(0.05)
        return real(data, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(image_zip_module, "decode_image", slow)
    return started


def test_a_parse_past_its_deadline_is_a_413_and_stores_nothing(tmp_path: Path, slow_decoding: list[float]) -> None:
    settings = make_settings(tmp_path / "data", upload_parse_deadline_s=0.5)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    headers = {"Authorization": f"Bearer {new_key(database, 'alice')}"}
    body = image_zip(class_images(50))  # 100 images: 5 s of decoding
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
        before = _stored(database, settings)
        response = client.post("/v1/datasets", params={**DATASET, "format": "zip"}, content=body, headers=headers)
        answered = time.monotonic()
        assert response.status_code == 413, response.text
        problem = response.json()
        assert problem["type"] == "/problems/parse-deadline-exceeded" and problem["reason"] == "parse-deadline"
        assert problem["deadline_s"] == 0.5 and "nothing was stored" in problem["detail"]
        assert _stored(database, settings) == before
        # Stopped at the deadline, not after every image (5 s of decoding): timed from the first image,
        # so that receiving the body and a busy machine's first-request costs do not count.
        assert len(slow_decoding) < 100 and answered - slow_decoding[0] < 4.0
    database.dispose()


def _abandoned_upload(base_url: str, key: str, body: bytes, *, started: list[float]) -> None:
    """Send a whole ZIP upload, wait until the server decodes its images, then hang up."""
    parts = urlsplit(base_url)
    query = urlencode({**DATASET, "name": "abandoned", "format": "zip"})
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST /v1/datasets?{query} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/zip\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        deadline = time.monotonic() + 20
        while len(started) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(started) >= 5, "the server never started decoding"


def test_a_client_that_disconnects_stops_the_parse_and_frees_its_upload_slot(
    tmp_path: Path, slow_decoding: list[float]
) -> None:
    """Issue 36: uploads kept decoding ~100 s after their client had gone, and the tenant's other
    uploads got 429. One upload slot per tenant: the hang-up must free it within a second or so."""
    settings = concurrency_settings(tmp_path, max_concurrent_uploads_per_tenant=1)
    migrate(settings)
    body = image_zip(class_images(100))  # 200 images: 10 s of decoding if never stopped
    with live_server(settings) as service:
        key = service.tenant_key("alice")
        _abandoned_upload(service.base_url, key, body, started=slow_decoding)
        hung_up = time.monotonic()
        with service.client(key) as client:
            while True:  # the slot is free once the parse has noticed (a poll of 0.25 s + one image)
                response = client.post(
                    "/v1/datasets",
                    content=digits_csv(),
                    params={**DATASET, "name": "next", "format": "csv", "label_column": "label"},
                )
                if response.status_code != 429 or time.monotonic() - hung_up > 5:
                    break
                time.sleep(0.05)
            freed_after = time.monotonic() - hung_up
            assert response.status_code == 201, response.text
            assert freed_after < 3.0, freed_after
            decoded = len(slow_decoding)
            time.sleep(0.5)
            assert len(slow_decoding) == decoded < 100  # the abandoned parse stopped for good
            names = [item["name"] for item in client.get("/v1/datasets").json()["items"]]
        assert names == ["next"]
        deadline = time.monotonic() + 5
        while any(settings.tmp_dir.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(settings.tmp_dir.iterdir())  # the abandoned upload's body is gone too


# ------------------------------------------------------------------------------- the worker


def test_the_worker_trains_on_the_stored_array_without_opening_the_zips_images(
    alice: TestClient, database: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The images are decoded once, at upload; a job reads their stored uint8 array and takes the
    labels from the ZIP's directory: no member of the ZIP is read and no image decoded."""
    response = alice.post(
        "/v1/datasets", params={**DATASET, "delta": 1e-3, "format": "zip", "classes": "dark,light"}, content=image_zip()
    )
    assert response.status_code == 201, response.text
    job = alice.post(
        "/v1/jobs",
        json={
            "dataset_id": response.json()["id"],
            "model": {"name": "logistic-regression", "params": {}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
            "privacy": {"target_epsilon": 2.0},
            "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.5},
        },
    )
    assert job.status_code == 202, job.text
    opened: list[str] = []
    decoded: list[object] = []
    real_open = zipfile.ZipFile.open
    real_load = ImageFile.ImageFile.load

    def open_member(archive: zipfile.ZipFile, name: object, *args: object, **kwargs: object) -> object:
        opened.append(str(getattr(name, "filename", name)))
        return real_open(archive, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(zipfile.ZipFile, "open", open_member)
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: decoded.append(image) or real_load(image))
    assert JobRunner(settings, db=database).run(job.json()["id"]) == "succeeded"
    assert not [name for name in opened if name.endswith(".png")] and decoded == []
