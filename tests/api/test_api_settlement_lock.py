"""Nothing slow runs under a dataset's budget-row lock: a job's report is uploaded after the
transaction that settles it (kernel/jobs/report_outbox.py), so a slow object store never stalls
another admission on the same dataset."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger
from tests.conftest import dp_sgd_spec, upload
from worker.runner import JobRunner

HELD_FOR_S = 60.0
"""How long the slow store holds a report's upload at most (released as soon as the test has seen
the admission through)."""


def _spec(dataset_id: str) -> dict[str, object]:
    spec = dp_sgd_spec(dataset_id, target_epsilon=1.0)
    spec["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
    return spec


def test_a_slow_report_upload_does_not_hold_up_an_admission_on_the_same_dataset(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    dataset = upload(alice, digits_csv, epsilon=10.0).json()
    first = alice.post("/v1/jobs", json=_spec(dataset["id"])).json()
    runner = JobRunner(settings, db=database)
    uploading, release = threading.Event(), threading.Event()
    store_report = runner.blobs.put_bytes

    def slow_put_bytes(data: bytes) -> tuple[str, str]:
        uploading.set()
        release.wait(HELD_FOR_S)
        return store_report(data)

    runner.blobs.put_bytes = slow_put_bytes  # type: ignore[method-assign]
    with ThreadPoolExecutor(max_workers=2) as pool:
        finishing = pool.submit(runner.run, first["id"])
        try:
            assert uploading.wait(120), "the job never reached its report's upload"
            # The first job's settlement committed: its report is served while its upload waits.
            view = alice.get(f"/v1/jobs/{first['id']}").json()
            assert view["status"] == "succeeded" and "report" in view["links"]
            report = alice.get(f"/v1/jobs/{first['id']}/report")
            assert report.status_code == 200 and report.json()["status"] == "succeeded"
            # Another admission on the same dataset takes the budget row the settlement held.
            admission = pool.submit(alice.post, "/v1/jobs", json=_spec(dataset["id"]))
            second = admission.result(timeout=HELD_FOR_S / 2)
            assert second.status_code == 202 and second.json()["status"] == "queued", second.text
            assert not release.is_set() and not finishing.done()  # the upload was still held meanwhile
        finally:
            release.set()
        assert finishing.result(timeout=120) == "succeeded"
    assert alice.get(f"/v1/jobs/{first['id']}/report").json() == report.json()
    assert verify_ledger(database).ok
