"""Fair sharing under load: many tenants' queued jobs over a few real workers, the ledger checked.

Why: with a first-in-first-out broker, the tenant who submits last waits for everyone else's whole
backlog. This run admits ``--jobs-per-tenant`` jobs for each of ``--tenants`` tenants, tenant after
tenant (the worst order for FIFO), against the API in process with PostgreSQL and Redis, while
``--workers`` real Celery worker processes train them (tiny DP-SGD jobs: sizes do not matter, the
queueing does). It reports, per tenant, how long its first job and its jobs in general waited
between admission and a worker starting them, how long the whole run took, and whether every job
succeeded and the ledger of every dataset verifies. ``--per-tenant`` is PRIVTRAIN_DISPATCH_PER_TENANT;
a value at least the number of jobs makes dispatch first in, first out, for comparison.

    .venv/bin/python -m bench.fair_share_load --tenants 20 --jobs-per-tenant 50 --workers 4
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from admin.cli import worker_command
from api.main import create_app
from bench.load_run import _digits_csv
from kernel.access.keys import generate_api_key, get_or_create_tenant, register_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger

REPO_ROOT = Path(__file__).resolve().parent.parent


def _job_spec(dataset_id: str) -> dict[str, object]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 20.0},
        "training": {"steps": 2, "batch_size": 64, "learning_rate": 0.5},
    }


def _env(settings: Settings) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"PRIVTRAIN_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PRIVTRAIN_DATABASE_URL"] = settings.resolved_database_url
    return env


def _seconds(later: str | None, earlier: str | None) -> float:
    from datetime import datetime

    if later is None or earlier is None:
        return float("nan")
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--jobs-per-tenant", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--per-tenant", type=int, default=4, help="PRIVTRAIN_DISPATCH_PER_TENANT (at most 10000)")
    parser.add_argument(
        "--database",
        default=os.environ.get("PRIVTRAIN_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--warmup-s", type=float, default=30, help="for the workers to start before submitting")
    args = parser.parse_args()

    name = f"privtrain_fair_{secrets.token_hex(4)}"
    admin = create_engine(args.database, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.database).set(database=name).render_as_string(hide_password=False)
    import redis

    redis.Redis.from_url(args.redis).flushdb()
    data = Path(tempfile.mkdtemp(prefix="privtrain-fair-"))
    settings = Settings(
        environment="test",
        data_dir=data / "api",
        storage_url=f"file://{data / 'blobs'}",  # one host here: the workers read the API's blobs
        database_url=url,
        broker_url=args.redis,
        rate_limit_per_minute=0,
        dispatch_per_tenant=args.per_tenant,
        max_active_jobs_per_tenant=max(50, args.jobs_per_tenant),
        heartbeat_interval_s=1.0,
        checkpoint_every_steps=0,
    )
    migrate(settings)
    db = Database(url)
    try:
        with TestClient(create_app(settings)) as client, ExitStack() as workers:
            csv = _digits_csv()
            tenants: dict[str, tuple[str, str]] = {}
            for number in range(args.tenants):
                key = generate_api_key()
                with db.write_transaction() as tx:
                    row = get_or_create_tenant(tx, f"tenant-{number:02d}")
                    register_api_key(tx, tenant=row, key=key)
                    tenant_id = row.id
                headers = {"Authorization": f"Bearer {key}"}
                query = {"name": "digits", "format": "csv", "label_column": "label", "epsilon": 50, "delta": 1e-6}
                dataset = client.post("/v1/datasets", params=query, content=csv, headers=headers).json()["id"]
                tenants[tenant_id] = (key, dataset)
            for number in range(args.workers):
                log = (data / f"worker-{number}.log").open("wb")
                workers.callback(log.close)
                process = subprocess.Popen(
                    worker_command(settings.consumed_queues, loglevel="WARNING"),
                    cwd=REPO_ROOT,
                    env=_env(settings.model_copy(update={"data_dir": data / f"worker-{number}"})),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                workers.callback(process.wait, 30)
                workers.callback(process.terminate)
            time.sleep(args.warmup_s)  # worker start-up (imports, warm-up) is not queueing
            started = time.monotonic()
            jobs: dict[str, list[str]] = {tenant: [] for tenant in tenants}
            for tenant, (key, dataset) in tenants.items():  # tenant after tenant: FIFO's worst case
                for _ in range(args.jobs_per_tenant):
                    response = client.post(
                        "/v1/jobs", json=_job_spec(dataset), headers={"Authorization": f"Bearer {key}"}
                    )
                    assert response.status_code == 202, response.text
                    jobs[tenant].append(response.json()["id"])
            submitted = time.monotonic() - started
            views: dict[str, dict[str, str]] = {}
            while time.monotonic() - started < args.timeout_s:
                for tenant, ids in jobs.items():
                    key = tenants[tenant][0]
                    for job_id in ids:
                        if views.get(job_id, {}).get("status") not in ("succeeded", "failed", "cancelled"):
                            views[job_id] = client.get(
                                f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}
                            ).json()
                if all(view.get("status") in ("succeeded", "failed", "cancelled") for view in views.values()):
                    break
                time.sleep(2.0)
            total = time.monotonic() - started
        statuses = [view["status"] for view in views.values()]
        report = verify_ledger(db)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"# {args.tenants} tenants × {args.jobs_per_tenant} jobs over {args.workers} workers, "
              f"dispatch_per_tenant {args.per_tenant}; PostgreSQL + Redis; {when}")  # fmt: skip
        print(f"# submitted in {submitted:.0f} s; all done after {total:.0f} s; "
              f"succeeded {statuses.count('succeeded')}/{len(statuses)}; ledger verifies: {report.ok}")  # fmt: skip
        print("| tenant (order of submission) | first job waited, s | median wait, s | last job started after, s |")
        print("|---|---:|---:|---:|")
        firsts = []
        for number, ids in enumerate(jobs.values()):
            waits = [_seconds(views[j].get("started_at"), views[j].get("created_at")) for j in ids]
            first = waits[0]
            firsts.append(first)
            last = max(_seconds(views[j].get("started_at"), views[ids[0]].get("created_at")) for j in ids)
            print(f"| {number + 1} | {first:.1f} | {statistics.median(waits):.1f} | {last:.1f} |")
        print(f"# first-job wait over tenants: median {statistics.median(firsts):.1f} s, max {max(firsts):.1f} s")
    finally:
        db.dispose()
        with admin.connect() as connection:
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name}
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


if __name__ == "__main__":
    main()
