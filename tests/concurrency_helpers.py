"""Helpers for the concurrent-admission tests (SQLite and PostgreSQL).

The app runs in a real uvicorn server on a background thread of the test process, so the sync
endpoints run in the server's threadpool and the submissions really race on the database
(docs/privacy-model.md#ledger: admission is one transaction holding the dataset's budget lock; concurrent
submissions can never overspend). The expected number of admissions k is computed here from the
privacy module itself, by folding the job's own curve through the Rényi filter.
"""

from __future__ import annotations

import socket
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from sqlalchemy import func, select

from api.main import create_app
from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget
from kernel.jobs.planning import plan_job
from kernel.ledger import operations as ledger
from kernel.ledger.audit import format_report, verify_ledger
from kernel.schemas.jobs import JobCreate
from tests.conftest import RecordingDispatcher, digits_split, dp_sgd_spec, make_settings, new_key, to_csv

N_CONCURRENT = 60
INSUFFICIENT = "/problems/insufficient-privacy-budget"
DATASET_DELTA = 1e-5  # digits train split has n = 1437 rows: δ < 1/n
# One fixed job: DP-SGD with an explicit σ, so every submission has the identical curve.
NOISE_MULTIPLIER = 2.0
TRAINING = {"steps": 20, "batch_size": 64, "learning_rate": 0.5}
K_RANGE = (5, 20)  # calibration guard: k must be neither trivial nor ≥ the number of submissions
REQUEST_TIMEOUT_S = 120.0  # longer than any server-side wait (pool / busy timeout), so we see its answer


def job_spec(dataset_id: str) -> dict[str, Any]:
    spec = dp_sgd_spec(dataset_id, noise_multiplier=NOISE_MULTIPLIER)
    spec["training"] = dict(TRAINING)
    return spec


@lru_cache(maxsize=1)
def digits_csv() -> bytes:
    X_train, _, y_train, _ = digits_split()
    return to_csv(X_train, y_train)


# --------------------------------------------------------------------------------------- server


def concurrency_settings(data_dir: Path, **overrides: object) -> Settings:
    """Test settings for the races; the in-process reconciler is off so that nothing but the
    submissions touches the ledger or the dispatcher while the test counts them, and the upload
    and pricing slots and the request caps are wide enough that the races are decided by the
    database, not by 429 caps.
    Every admitted job goes to the broker at once (fair sharing's per-tenant share is wider than
    any race here), so each must be sent exactly once, however the submissions interleave."""
    values: dict[str, object] = {
        "max_upload_bytes": 5_000_000,
        "dispatch_per_tenant": 10_000,
        "run_reconciler": False,
        "max_concurrent_uploads": 64,
        "max_concurrent_uploads_per_tenant": 64,
        "max_concurrent_plans": 64,
        "max_concurrent_plans_per_key": 64,
        "max_concurrent_requests": 256,
        "max_concurrent_requests_per_tenant": 256,
        "max_concurrent_requests_per_key": 256,
    }
    values.update(overrides)
    return make_settings(data_dir, **values)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveService:
    base_url: str
    settings: Settings
    db: Database
    dispatcher: RecordingDispatcher

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=REQUEST_TIMEOUT_S,
        )

    def tenant_key(self, tenant: str) -> str:
        return new_key(self.db, tenant)


@contextmanager
def live_server(settings: Settings) -> Iterator[LiveService]:
    """The real app (RecordingDispatcher, no worker) behind uvicorn on a free port."""
    dispatcher = RecordingDispatcher()
    app = create_app(settings, dispatcher=dispatcher)
    port = free_port()
    server = uvicorn.Server(
        # A long keep-alive: on a loaded runner a client may reuse a connection more than uvicorn's
        # default 5 s later, and a server closing it at that moment resets the next request.
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_keep_alive=120)
    )
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # pragma: no cover  # noqa: BLE001 - any server crash, surfaced below
            crashed.append(exc)

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if crashed or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start: {crashed!r}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("uvicorn did not start within 30 s")
        time.sleep(0.02)
    db = Database(settings.resolved_database_url)
    try:
        yield LiveService(f"http://127.0.0.1:{port}", settings, db, dispatcher)
    finally:
        db.dispose()
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "uvicorn did not stop"


def upload_digits(client: httpx.Client, *, epsilon: float, name: str = "digits") -> dict[str, Any]:
    response = client.post(
        "/v1/datasets",
        params={"name": name, "format": "csv", "label_column": "label", "epsilon": epsilon, "delta": DATASET_DELTA},
        content=digits_csv(),
    )
    assert response.status_code == 201, response.text
    return response.json()


# ------------------------------------------------------------------------------ expected count


def job_curve(live: LiveService, dataset_id: str, spec: dict[str, Any]) -> tuple[float, ...]:
    """The curve the server will charge: the same plan_job the endpoint calls, on the stored dataset."""
    with live.db.read_session() as session:
        dataset = session.get(Dataset, dataset_id)
        budget = session.get(PrivacyBudget, dataset_id)
        assert dataset is not None and budget is not None
        plan = plan_job(JobCreate(**spec), dataset, dataset_delta=budget.delta, max_steps=live.settings.max_steps)
    return plan.curve


def folded(curve: Sequence[float], times: int) -> tuple[float, ...]:
    """``times`` copies of ``curve`` summed the way the ledger sums reservations."""
    total = tuple(0.0 for _ in privacy.ORDERS)
    for _ in range(times):
        total = privacy.add_curves(total, curve)
    return total


def expected_admissions(curve: Sequence[float], epsilon: float, delta: float, *, limit: int = 1000) -> int:
    """Largest k such that the filter admits the k-th copy of ``curve`` after k-1 reservations."""
    capacity = privacy.capacity_curve(epsilon, delta)
    zeros = tuple(0.0 for _ in privacy.ORDERS)
    reserved = zeros
    k = 0
    while k < limit:
        if privacy.admission_order(committed=zeros, reserved=reserved, cost=tuple(curve), capacity=capacity) is None:
            return k
        reserved = privacy.add_curves(reserved, curve)
        k += 1
    raise AssertionError(f"more than {limit} admissions: the job is (nearly) free")


# ----------------------------------------------------------------------------------- firing


@dataclass
class Outcome:
    index: int
    status: int | None
    body: Any
    elapsed_s: float
    error: str | None = None

    def describe(self) -> str:
        if self.error:
            return f"#{self.index}: client error after {self.elapsed_s:.2f}s\n{self.error}"
        return f"#{self.index}: HTTP {self.status} after {self.elapsed_s:.2f}s: {self.body!r}"


@dataclass
class Submission:
    key: str  # the tenant's API key
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def fire_concurrently(live: LiveService, submissions: Sequence[Submission]) -> list[Outcome]:
    """POST every submission from its own thread and client, all released by one barrier."""
    n = len(submissions)
    barrier = threading.Barrier(n)
    outcomes: list[Outcome | None] = [None] * n

    def one(index: int) -> None:
        submission = submissions[index]
        with live.client(submission.key) as client:
            # Connect before the barrier so the race is on the database, not on TCP accept.
            client.get("/healthz")
            barrier.wait(timeout=60)
            start = time.monotonic()
            try:
                response = client.post("/v1/jobs", json=submission.body, headers=submission.headers)
            except Exception:  # noqa: BLE001 - the thread records any failure as its outcome, with the traceback
                outcomes[index] = Outcome(index, None, None, time.monotonic() - start, traceback.format_exc())
                return
            elapsed = time.monotonic() - start
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text
            outcomes[index] = Outcome(index, response.status_code, body, elapsed)

    threads = [threading.Thread(target=one, args=(i,), name=f"submit-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=REQUEST_TIMEOUT_S + 90)
    assert not any(t.is_alive() for t in threads), "a submission thread hung"
    missing = [i for i, o in enumerate(outcomes) if o is None]
    assert not missing, f"submissions without an outcome (barrier or health check failed): {missing}"
    return [o for o in outcomes if o is not None]


def split_outcomes(outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    """(admitted 202s, rejected 409 insufficient-budget); anything else fails with every body shown."""
    admitted = [o for o in outcomes if o.status == 202 and isinstance(o.body, dict)]
    rejected = [
        o for o in outcomes if o.status == 409 and isinstance(o.body, dict) and o.body.get("type") == INSUFFICIENT
    ]
    expected = {o.index for o in admitted} | {o.index for o in rejected}
    unexpected = [o for o in outcomes if o.index not in expected]
    assert not unexpected, (
        f"{len(unexpected)} of {len(outcomes)} submissions answered neither 202 nor 409 "
        f"{INSUFFICIENT}:\n" + "\n".join(o.describe() for o in unexpected)
    )
    return admitted, rejected


# ------------------------------------------------------------------------------ invariants


def assert_budget_within_capacity(budget: dict[str, Any], curve: Sequence[float], max_jobs: int) -> int:
    """A budget view is m·curve reserved (m ≤ max_jobs), nothing committed, and fits at some order.

    Returns m.
    """
    capacity = privacy.capacity_curve(budget["epsilon"], budget["delta"])
    per_order = budget["per_order"]
    assert [row["order"] for row in per_order] == list(privacy.ORDERS)
    assert [row["capacity"] for row in per_order] == list(capacity)
    assert all(row["committed"] == 0.0 for row in per_order), per_order
    reserved = tuple(row["reserved"] for row in per_order)
    matches = [m for m in range(max_jobs + 1) if folded(curve, m) == reserved]
    assert matches, f"reserved curve {reserved} is not m·cost for any m <= {max_jobs}"
    witnesses = [row["order"] for row in per_order if row["committed"] + row["reserved"] <= row["capacity"]]
    assert witnesses, f"committed + reserved exceeds capacity at every order: {per_order}"
    assert budget["spent_epsilon"] <= budget["epsilon"], budget
    return matches[0]


class BudgetWatcher:
    """Polls GET /budget while the race runs; every snapshot must be within capacity."""

    def __init__(self, live: LiveService, key: str, dataset_id: str, curve: Sequence[float], k: int) -> None:
        self._live, self._key, self._dataset_id = live, key, dataset_id
        self._curve, self._k = tuple(curve), k
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{dataset_id}", daemon=True)
        self.snapshots: list[int] = []
        self.failures: list[str] = []

    def _run(self) -> None:
        with self._live.client(self._key) as client:
            while not self._stop.is_set():
                try:
                    response = client.get(f"/v1/datasets/{self._dataset_id}/budget")
                    assert response.status_code == 200, response.text
                    self.snapshots.append(assert_budget_within_capacity(response.json(), self._curve, self._k))
                except Exception:  # noqa: BLE001 - a watcher thread records any failure for the test to assert on
                    self.failures.append(traceback.format_exc())
                    return
                time.sleep(0.005)

    def __enter__(self) -> BudgetWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=REQUEST_TIMEOUT_S)

    def check(self) -> None:
        assert not self.failures, "budget snapshot during the race broke an invariant:\n" + "\n".join(self.failures)
        assert self.snapshots, "the budget watcher took no snapshot"
        assert self.snapshots == sorted(self.snapshots), f"reservations went backwards: {self.snapshots}"


def budget_view(client: httpx.Client, dataset_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/datasets/{dataset_id}/budget")
    assert response.status_code == 200, response.text
    return response.json()


def genesis_of(client: httpx.Client, dataset_id: str) -> str:
    """The chain anchor: the fresh budget's last_hash, before any entry exists."""
    budget = budget_view(client, dataset_id)
    assert budget["entries"] == 0, budget
    return str(budget["last_hash"])


def ledger_items(client: httpx.Client, dataset_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        response = client.get(f"/v1/datasets/{dataset_id}/ledger", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if not cursor:
            return items


def assert_ledger_state(
    live: LiveService,
    client: httpx.Client,
    dataset_id: str,
    *,
    curve: Sequence[float],
    k: int,
    admitted_ids: set[str],
    genesis: str,
    exhausted: bool = True,
) -> None:
    """After the race: exactly the k admitted jobs are reserved, chained and dispatched.

    ``genesis`` is the budget's ``last_hash`` read before any submission (the chain's anchor);
    ``exhausted``: the race was meant to fill the budget, so a (k+1)-th job must not fit.
    """
    assert len(admitted_ids) == k, f"{len(admitted_ids)} distinct admitted job ids, expected {k}"

    # The API's view of the ledger: k RESERVE entries, seq 1..k, an unbroken hash chain.
    items = ledger_items(client, dataset_id)
    assert [e["kind"] for e in items] == ["RESERVE"] * k, [e["kind"] for e in items]
    assert [e["seq"] for e in items] == list(range(1, k + 1))
    assert {e["job_id"] for e in items} == admitted_ids
    previous = genesis
    for entry in items:
        assert entry["prev_hash"] == previous, f"hash chain broken at seq {entry['seq']}"
        assert entry["curve"] == list(curve), f"seq {entry['seq']} reserved a different curve"
        previous = entry["hash"]

    # The budget view: exactly k·cost reserved, within capacity at some order, and full.
    budget = budget_view(client, dataset_id)
    assert assert_budget_within_capacity(budget, curve, k) == k
    assert budget["entries"] == k
    assert budget["last_hash"] == previous
    capacity = privacy.capacity_curve(budget["epsilon"], budget["delta"])
    zeros = tuple(0.0 for _ in privacy.ORDERS)
    fits_another = (
        privacy.admission_order(committed=zeros, reserved=folded(curve, k), cost=tuple(curve), capacity=capacity)
        is not None
    )
    assert fits_another is not exhausted, (
        "a (k+1)-th job would still have fitted" if exhausted else "one job must not fill the budget"
    )

    # The database itself: k jobs, k entries whose stored hashes recompute, k dispatches.
    with live.db.read_session() as session:
        jobs = set(session.scalars(select(Job.id).where(Job.dataset_id == dataset_id)))
        assert jobs == admitted_ids, f"database has {len(jobs)} jobs for the dataset, expected {k}"
        statuses = set(session.scalars(select(Job.status).where(Job.dataset_id == dataset_id)))
        assert statuses <= {"queued"}, statuses
        entries = list(
            session.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id).order_by(LedgerEntry.seq))
        )
        assert len(entries) == k
        for entry in entries:
            assert ledger.entry_hash(entry) == entry.hash, f"stored hash of seq {entry.seq} does not recompute"
        count = session.scalar(
            select(func.count()).select_from(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id)
        )
        assert count == k
    report = verify_ledger(live.db, dataset_id=dataset_id)
    assert not report.problems, format_report(report)
    dispatched = [job_id for job_id in live.dispatcher.sent if job_id in jobs]
    assert sorted(dispatched) == sorted(admitted_ids), "each admitted job must be dispatched exactly once"
    assert len(set(live.dispatcher.sent)) == len(live.dispatcher.sent), "a job was sent twice"


# -------------------------------------------------------------------------------- scenarios


def summary(label: str, outcomes: Sequence[Outcome], wall_s: float) -> str:
    latencies = sorted(o.elapsed_s for o in outcomes)
    return (
        f"{label}: {len(outcomes)} submissions in {wall_s:.2f}s wall, "
        f"latency median {latencies[len(latencies) // 2]:.3f}s max {latencies[-1]:.3f}s"
    )


def run_single_dataset_race(live: LiveService, *, epsilon: float = 2.0, n: int = N_CONCURRENT) -> int:
    """N submissions of one job against a budget that fits exactly k of them. Returns k."""
    key = live.tenant_key("alice")
    with live.client(key) as client:
        dataset = upload_digits(client, epsilon=epsilon)
        spec = job_spec(dataset["id"])
        curve = job_curve(live, dataset["id"], spec)
        k = expected_admissions(curve, epsilon, DATASET_DELTA)
        assert K_RANGE[0] <= k <= K_RANGE[1], f"calibration drifted: k = {k}"
        assert n >= 50 and k < n
        genesis = genesis_of(client, dataset["id"])

        started = time.monotonic()
        with BudgetWatcher(live, key, dataset["id"], curve, k) as watcher:
            outcomes = fire_concurrently(live, [Submission(key, spec) for _ in range(n)])
        wall = time.monotonic() - started
        print(summary(f"single dataset (k = {k})", outcomes, wall), f"; {len(watcher.snapshots)} budget snapshots")
        admitted, rejected = split_outcomes(outcomes)
        watcher.check()
        assert len(admitted) == k, f"{len(admitted)} admitted, expected exactly k = {k}"
        assert len(rejected) == n - k
        for o in admitted:
            assert o.body["status"] == "queued" and o.body["dataset_id"] == dataset["id"]
        assert_ledger_state(
            live,
            client,
            dataset["id"],
            curve=curve,
            k=k,
            admitted_ids={o.body["id"] for o in admitted},
            genesis=genesis,
        )
    return k


def run_two_dataset_race(
    live: LiveService, *, epsilons: tuple[float, float] = (2.0, 1.5), n: int = N_CONCURRENT
) -> tuple[int, int]:
    """Interleaved submissions to two datasets of two tenants; each ends with its own exact k."""
    keys = (live.tenant_key("carol"), live.tenant_key("dave"))
    datasets, curves, ks, specs, geneses = [], [], [], [], []
    for key, epsilon in zip(keys, epsilons, strict=True):
        with live.client(key) as client:
            dataset = upload_digits(client, epsilon=epsilon, name=f"digits-{epsilon}")
            geneses.append(genesis_of(client, dataset["id"]))
        spec = job_spec(dataset["id"])
        curve = job_curve(live, dataset["id"], spec)
        k = expected_admissions(curve, epsilon, DATASET_DELTA)
        assert K_RANGE[0] <= k <= K_RANGE[1], f"calibration drifted: k = {k} at ε = {epsilon}"
        assert k < n // 2
        datasets.append(dataset)
        curves.append(curve)
        ks.append(k)
        specs.append(spec)
    assert ks[0] != ks[1], "pick budgets with different k so a mix-up between datasets shows"

    submissions = [Submission(keys[i % 2], specs[i % 2]) for i in range(n)]
    started = time.monotonic()
    with (
        BudgetWatcher(live, keys[0], datasets[0]["id"], curves[0], ks[0]) as w0,
        BudgetWatcher(live, keys[1], datasets[1]["id"], curves[1], ks[1]) as w1,
    ):
        outcomes = fire_concurrently(live, submissions)
    wall = time.monotonic() - started
    print(summary(f"two datasets (k = {ks[0]}, {ks[1]})", outcomes, wall))
    admitted, _ = split_outcomes(outcomes)
    w0.check()
    w1.check()
    for side in (0, 1):
        ok = [o for o in admitted if o.index % 2 == side]
        assert len(ok) == ks[side], f"dataset {side}: {len(ok)} admitted, expected k = {ks[side]}"
        assert all(o.body["dataset_id"] == datasets[side]["id"] for o in ok)
        with live.client(keys[side]) as client:
            assert_ledger_state(
                live,
                client,
                datasets[side]["id"],
                curve=curves[side],
                k=ks[side],
                admitted_ids={o.body["id"] for o in ok},
                genesis=geneses[side],
            )
    return ks[0], ks[1]


def run_idempotent_race(live: LiveService, *, n: int = 20) -> None:
    """n concurrent submissions with the same Idempotency-Key and body: one job, one RESERVE."""
    key = live.tenant_key("erin")
    with live.client(key) as client:
        dataset = upload_digits(client, epsilon=2.0)
        spec = job_spec(dataset["id"])
        curve = job_curve(live, dataset["id"], spec)
        genesis = genesis_of(client, dataset["id"])
        headers = {"Idempotency-Key": f"race-{dataset['id']}"}
        started = time.monotonic()
        outcomes = fire_concurrently(live, [Submission(key, spec, headers) for _ in range(n)])
        print(summary("idempotent", outcomes, time.monotonic() - started))
        unexpected = [o for o in outcomes if o.status not in (200, 202) or not isinstance(o.body, dict)]
        assert not unexpected, "idempotent replays must answer 202 or 200:\n" + "\n".join(
            o.describe() for o in unexpected
        )
        ids = {o.body["id"] for o in outcomes}
        assert len(ids) == 1, f"one Idempotency-Key produced {len(ids)} jobs: {ids}"
        assert sum(o.status == 202 for o in outcomes) == 1, [o.status for o in outcomes]
        assert_ledger_state(
            live, client, dataset["id"], curve=curve, k=1, admitted_ids=ids, genesis=genesis, exhausted=False
        )


def run_duplicate_upload_race(live: LiveService, *, n: int = 8) -> None:
    """n concurrent uploads of the same bytes by one tenant: one dataset, one budget; every other
    upload is a 409 naming it, and no blob or temp file is lost or left behind."""
    key = live.tenant_key("frank")
    barrier = threading.Barrier(n)
    answers: list[tuple[int, Any] | None] = [None] * n
    params = {"name": "digits", "format": "csv", "label_column": "label", "epsilon": 4.0, "delta": DATASET_DELTA}

    def one(index: int) -> None:
        with live.client(key) as client:
            client.get("/healthz")
            barrier.wait(timeout=60)
            response = client.post("/v1/datasets", params=params, content=digits_csv())
            answers[index] = (response.status_code, response.json())

    threads = [threading.Thread(target=one, args=(i,), name=f"upload-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=REQUEST_TIMEOUT_S + 90)
    assert all(a is not None for a in answers), answers
    statuses = sorted(a[0] for a in answers if a is not None)
    assert statuses == [201] + [409] * (n - 1), statuses
    registered = next(a[1] for a in answers if a is not None and a[0] == 201)
    for _status, body in (a for a in answers if a is not None and a[0] == 409):
        assert body["type"] == "/problems/dataset-already-registered"
        assert body["existing_dataset_id"] == registered["id"]
    with live.client(key) as client:
        listed = client.get("/v1/datasets", params={"limit": 200}).json()["items"]
        assert [d["id"] for d in listed] == [registered["id"]]
        assert client.get(f"/v1/datasets/{registered['id']}/budget").json()["entries"] == 0
    blobs = [p for p in live.settings.blob_dir.rglob("*") if p.is_file()]
    assert any(p.name == registered["sha256"] for p in blobs), "the registered dataset's blob must survive"
    assert not [p for p in live.settings.tmp_dir.rglob("*") if p.is_file()], "no temp file left behind"
