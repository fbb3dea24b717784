"""Load run on loopback: many concurrent clients against one API process with PostgreSQL and Redis.

The API runs as it does in production's distributed mode (`privtrain-admin serve --no-worker`,
one uvicorn process, PostgreSQL, Redis as the broker; no worker, so submitted jobs stay queued).
Each client loops until the run's time or request budget is spent, choosing per request:
status polls of a job (weight 7), event reads (2) and submissions (1, priced with an explicit
noise multiplier so each admission is one RDP evaluation, not a calibration search). Every
tenant has its own dataset and key; rate limits are off and the active-job, pricing and request
caps are raised for the run, so the figures measure the service, not its protections (with the
request cap raised to the number of clients, the thread pool of sync routes grows to that number
plus 8: ``api.main.size_thread_pool``).

    .venv/bin/python -m bench.load_run --clients 200 --seconds 30 \\
        --database postgresql+psycopg://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/13

Reports throughput, p50/p99 latency per operation and overall, and errors (5xx or transport
failures; 4xx answers are counted separately by status).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from kernel.access.keys import generate_api_key, get_or_create_tenant, register_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database

REPO_ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = {"poll": 7, "events": 2, "submit": 1}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _digits_csv() -> bytes:
    from sklearn.datasets import load_digits

    digits = load_digits()
    lines = [",".join([f"x{i}" for i in range(64)] + ["label"])]
    lines += [
        ",".join(repr(float(v) / 16.0) for v in row) + f",{int(t)}"
        for row, t in zip(digits.data, digits.target, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode()


def _job_spec(dataset_id: str) -> dict:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 20.0},
        "training": {"steps": 10, "batch_size": 64, "learning_rate": 0.5},
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _client(
    base: str,
    key: str,
    dataset_id: str,
    job_ids: list[str],
    *,
    until: float,
    budget: list[int],
    results: dict[str, list[float]],
    statuses: Counter,
    errors: Counter,
    rng: random.Random,
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30.0) as http:
        while time.monotonic() < until and budget[0] > 0:
            budget[0] -= 1
            op = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
            started = time.perf_counter()
            try:
                if op == "poll":
                    response = await http.get(f"/v1/jobs/{rng.choice(job_ids)}")
                elif op == "events":
                    response = await http.get(f"/v1/jobs/{rng.choice(job_ids)}/events")
                else:
                    response = await http.post("/v1/jobs", json=_job_spec(dataset_id))
                    if response.status_code == 202:
                        job_ids.append(response.json()["id"])
            except httpx.HTTPError as exc:
                errors[f"{op}: {type(exc).__name__}"] += 1
                continue
            results[op].append(time.perf_counter() - started)
            statuses[(op, response.status_code)] += 1
            if response.status_code >= 500:
                errors[f"{op}: HTTP {response.status_code}"] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--max-requests", type=int, default=50_000)
    parser.add_argument(
        "--database",
        default=os.environ.get("PRIVTRAIN_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()

    name = f"privtrain_load_{secrets.token_hex(4)}"
    admin = create_engine(args.database, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    database_url = make_url(args.database).set(database=name).render_as_string(hide_password=False)
    port = _free_port()
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = {
                **os.environ,
                "PRIVTRAIN_DATA_DIR": str(Path(tmp) / "data"),
                "PRIVTRAIN_DATABASE_URL": database_url,
                "PRIVTRAIN_BROKER_URL": args.redis,
                "PRIVTRAIN_RATE_LIMIT_PER_MINUTE": "0",
                "PRIVTRAIN_MAX_ACTIVE_JOBS_PER_TENANT": "1000000",
                "PRIVTRAIN_MAX_CONCURRENT_PLANS": "1000",
                "PRIVTRAIN_MAX_CONCURRENT_PLANS_PER_KEY": "1000",
                **{
                    f"PRIVTRAIN_MAX_CONCURRENT_{cap}": str(args.clients)
                    for cap in ("REQUESTS", "REQUESTS_PER_TENANT", "REQUESTS_PER_KEY", "UNVERIFIED_REQUESTS")
                },
                "PRIVTRAIN_LOG_LEVEL": "WARNING",
            }
            settings = Settings(data_dir=Path(tmp) / "data", database_url=database_url, broker_url=args.redis)
            migrate(settings)
            db = Database(database_url)
            keys = []
            for i in range(args.tenants):
                key = generate_api_key()
                with db.write_transaction() as session:
                    register_api_key(session, tenant=get_or_create_tenant(session, f"load{i}"), key=key)
                keys.append(key)
            db.dispose()
            server = subprocess.Popen(
                [sys.executable, "-m", "admin.cli", "serve", "--no-worker", "--port", str(port)],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the API did not start")
                time.sleep(0.3)
            body = _digits_csv()
            tenants = []
            for key in keys:
                headers = {"Authorization": f"Bearer {key}"}
                dataset = httpx.post(
                    f"{base}/v1/datasets",
                    headers=headers,
                    content=body,
                    timeout=60,
                    params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 100, "delta": 1e-5},
                ).json()
                job = httpx.post(f"{base}/v1/jobs", headers=headers, json=_job_spec(dataset["id"]), timeout=60).json()
                tenants.append((key, dataset["id"], [job["id"]]))

            results: dict[str, list[float]] = defaultdict(list)
            statuses: Counter = Counter()
            errors: Counter = Counter()
            budget = [args.max_requests]

            async def run() -> float:
                started = time.monotonic()
                until = started + args.seconds
                await asyncio.gather(
                    *(
                        _client(
                            base,
                            *tenants[i % len(tenants)],
                            until=until,
                            budget=budget,
                            results=results,
                            statuses=statuses,
                            errors=errors,
                            rng=random.Random(i),
                        )
                        for i in range(args.clients)
                    )
                )
                return time.monotonic() - started

            elapsed = asyncio.run(run())
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        with admin.connect() as connection:
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name}
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()

    total = sum(len(v) for v in results.values())
    print(
        f"# {args.clients} clients, {args.tenants} tenants, {elapsed:.1f} s, {total} answered requests, "
        f"{sum(errors.values())} errors, {time.strftime('%Y-%m-%d')}"
    )
    print("| operation | requests | req/s | p50 ms | p99 ms | statuses |")
    print("|---|---:|---:|---:|---:|---|")
    everything: list[float] = []
    for op in WEIGHTS:
        latencies = results[op]
        everything += latencies
        codes = ", ".join(f"{code}: {count}" for (o, code), count in sorted(statuses.items()) if o == op)
        print(
            f"| {op} | {len(latencies)} | {len(latencies) / elapsed:.1f} | "
            f"{1e3 * statistics.median(latencies):.0f} | {1e3 * _percentile(latencies, 0.99):.0f} | {codes} |"
        )
    print(
        f"| all | {total} | {total / elapsed:.1f} | {1e3 * statistics.median(everything):.0f} | "
        f"{1e3 * _percentile(everything, 0.99):.0f} | |"
    )
    if errors:
        print("errors:", dict(errors))


if __name__ == "__main__":
    main()
