"""Attack run: issues 13's and 36's attacks against a running embedded service, with bystanders watching.

The service runs as users start it (`privtrain-admin serve`: SQLite, filesystem broker and one
worker, in a fresh temporary data dir, on a free loopback port) with every protection at its
default: inherited ``PRIVTRAIN_*`` variables are dropped, so what is measured is what ships
(``--setting`` overrides one setting, and the report's first line says so). Tenant A attacks (one
fresh API key per attack, so one attack's rate-limit debt never shields the next; several for an
attack that spreads over keys), tenant B is the bystander, tenant C is a third name for the grant
probe. Before the GET floods, A's dataset gets a history (200 jobs submitted and cancelled), so
that its pages cost what they cost in use.

While each attack runs, a separate process (so a busy attacker cannot slow the measurement
itself) probes open-loop: ``GET /healthz`` every 50 ms and B's ``GET /v1/datasets`` every 100 ms,
fired on schedule whether or not earlier probes have answered; a probe unanswered after 10 s
counts as 10 s and as a failure. An attack *held* when the healthz p99 and B's p99 stay under
1 s, the attacker got no 5xx and no hang (timeout or broken connection), and none of the
attack's own expectations failed (e.g. a refused spec that was accepted, a budget that moved).
Between attacks A's queued and running jobs are cancelled and the run waits for a quiet service.

    .venv/bin/python -m bench.attack_run [--seconds 15] [--only NAME]... [--json PATH] [--setting NAME=VALUE]...

About 4 minutes in all. Prints a markdown table (one row per attack, plus two reference rows
without an attack: ``idle``, the service at rest, and ``training``, one of A's jobs running on the
worker) and the notes and findings below it; ``--json`` adds every probe sample.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import multiprocessing
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np

from bench.load_run import _digits_csv, _free_port, _percentile
from kernel.access.keys import generate_api_key, get_or_create_tenant, register_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.pagination import encode_cursor

REPO_ROOT = Path(__file__).resolve().parent.parent
HELD_BELOW_S = 1.0
PROBE_TIMEOUT_S = 10.0
HEALTHZ_EVERY_S = 0.05
BYSTANDER_EVERY_S = 0.1
ATTACK_TIMEOUT_S = 10.0
"""An attacker's request unanswered after this long is a hang (the same bound as the probes)."""
ATTACK_OVERRUN_S = 30.0
QUICK_REFUSAL_S = 5.0
BOMB_ROWS, BOMB_COLS = 131_072, 1024  # X alone: 1 GiB of float64 zeros
LOGISTIC = {"name": "logistic-regression", "params": {}}
HUGE_MLP = {"name": "mlp", "params": {"hidden_sizes": [16384] * 8}}
TENANTS = {"attacker": "attacker", "bystander": "bystander", "third": "third"}


# ----------------------------------------------------------------------------- records


@dataclass
class AttackRecord:
    """What the attacker got, per label, and what the attack found."""

    statuses: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def count(self, *, label: str, outcome: str) -> None:
        self.statuses[label][outcome] += 1

    def outcomes(self) -> Counter[str]:
        merged: Counter[str] = Counter()
        for counts in self.statuses.values():
            merged.update(counts)
        return merged

    def label_outcomes(self, label: str) -> Counter[str]:
        return self.statuses.get(label, Counter())


class Sample(NamedTuple):
    sent_at_s: float
    """Seconds after the probe started: when this probe was fired."""
    latency_s: float
    ok: bool
    outcome: str = "200"
    """What a failed probe got: '429 too-many-concurrent-requests', 'timeout', …"""


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    failures: int

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> LatencySummary:
        latencies = [sample.latency_s for sample in samples]
        return cls(
            count=len(samples),
            p50_ms=1e3 * _percentile(latencies, 0.5),
            p99_ms=1e3 * _percentile(latencies, 0.99),
            max_ms=1e3 * max(latencies, default=float("nan")),
            failures=sum(1 for sample in samples if not sample.ok),
        )

    def cell(self) -> str:
        return f"{self.p50_ms:.0f} / {self.p99_ms:.0f} / {self.max_ms:.0f}"


def is_server_error(outcome: str) -> bool:
    return outcome[:1] == "5"


def is_hang(outcome: str) -> bool:
    """A timeout or a broken connection: the attacker was left without an answer."""
    return outcome == "timeout" or outcome.startswith("error ")


def verdict(*, healthz_p99_ms: float, bystander_p99_ms: float, outcomes: Counter[str], problems: Sequence[str]) -> str:
    """'held', or 'NOT held' with every reason (a missing figure counts as not held)."""
    reasons = []
    if not healthz_p99_ms < HELD_BELOW_S * 1e3:
        reasons.append("healthz p99 ≥ 1 s")
    if not bystander_p99_ms < HELD_BELOW_S * 1e3:
        reasons.append("bystander p99 ≥ 1 s")
    server_errors = sum(n for outcome, n in outcomes.items() if is_server_error(outcome))
    hangs = sum(n for outcome, n in outcomes.items() if is_hang(outcome))
    if server_errors:
        reasons.append(f"{server_errors}× 5xx")
    if hangs:
        reasons.append(f"{hangs}× hang")
    if problems:
        reasons.append(f"{len(problems)} finding{'s' if len(problems) > 1 else ''}")
    return "held" if not reasons else "NOT held: " + ", ".join(reasons)


def format_outcomes(statuses: dict[str, Counter[str]]) -> str:
    """'label: 422×3, 429 rate-limited×40; label2: …' in a stable order."""
    parts = []
    for label, counts in statuses.items():
        codes = ", ".join(f"{outcome}×{n}" for outcome, n in sorted(counts.items()))
        parts.append(f"{label}: {codes}")
    return "; ".join(parts) or "—"


# ----------------------------------------------------------------------------- attacker side


@dataclass(frozen=True)
class AttackContext:
    base: str
    attacker_key: str
    extra_attacker_keys: tuple[str, ...]
    """More keys of the attacking tenant, for attacks that spread over keys (``Attack.keys``)."""
    admin_key: str
    """Tenant A's setup key: reads A's budget and cleans up, never part of the attack."""
    dataset_id: str
    bystander_name: str
    third_name: str
    data_dir: Path
    api_pid: int
    digits_csv: bytes
    npz_bomb: bytes
    until: float

    def client(
        self, *, key: str | None = None, read_timeout_s: float | None = ATTACK_TIMEOUT_S, authorised: bool = True
    ) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key or self.attacker_key}"} if authorised else {}
        return httpx.AsyncClient(
            base_url=self.base,
            headers=headers,
            timeout=httpx.Timeout(ATTACK_TIMEOUT_S, read=read_timeout_s),
            # idle connections dropped well before uvicorn's 5 s keep-alive closes them, so a reused
            # one is never being closed by the server at that moment (a broken connection is a hang)
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=200, keepalive_expiry=2.0),
        )

    def remaining_s(self) -> float:
        return max(0.0, self.until - time.monotonic())


AttackFn = Callable[[AttackContext, AttackRecord], Awaitable[None]]


@dataclass(frozen=True)
class Attack:
    name: str
    run: AttackFn
    min_seconds: float
    summary: str
    tenant: str
    """The role whose fresh key the attack uses: "attacker" (A) unless it needs an empty tenant."""
    keys: int = 1
    """Fresh keys of that tenant the attack gets (the first is ``attacker_key``)."""
    needs_history: bool = False
    """Whether A's dataset should first get a ledger and job history (``build_history``)."""


ATTACKS: dict[str, Attack] = {}


def attack(
    name: str, *, min_seconds: float = 0.0, tenant: str = "attacker", keys: int = 1, needs_history: bool = False
) -> Callable[[AttackFn], AttackFn]:
    """Register an attack; its docstring's first line is its summary."""

    def register(run: AttackFn) -> AttackFn:
        ATTACKS[name] = Attack(
            name=name,
            run=run,
            min_seconds=min_seconds,
            tenant=tenant,
            keys=keys,
            needs_history=needs_history,
            summary=(run.__doc__ or name).strip().splitlines()[0],
        )
        return run

    return register


async def outcome_of(response: httpx.Response) -> str:
    """'200', or '422 validation-error' (the problem's slug) for an error answer."""
    if response.status_code < 400:
        return str(response.status_code)
    await response.aread()
    try:
        slug = str(response.json().get("type", "")).rsplit("/", 1)[-1]
    except (ValueError, AttributeError):
        slug = ""
    return f"{response.status_code} {slug}".strip()


async def send(
    http: httpx.AsyncClient,
    record: AttackRecord,
    *,
    label: str,
    method: str,
    url: str,
    json_body: Any = None,
    content: bytes | None = None,
    params: dict[str, Any] | None = None,
    data: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response | None:
    """One attacker request, its outcome counted under `label`; None if it got no answer."""
    try:
        response = await http.request(
            method, url, json=json_body, content=content, params=params, data=data, headers=headers
        )
    except httpx.TimeoutException:
        record.count(label=label, outcome="timeout")
        return None
    except httpx.TransportError as exc:
        record.count(label=label, outcome=f"error {type(exc).__name__}")
        return None
    record.count(label=label, outcome=await outcome_of(response))
    return response


async def repeat_until(until: float, *, workers: int, body: Callable[[int], Awaitable[None]]) -> None:
    """`workers` loops calling body(n) with a shared counter n until the deadline."""
    counter = iter(range(10**12))

    async def loop() -> None:
        while time.monotonic() < until:
            await body(next(counter))

    await asyncio.gather(*(loop() for _ in range(workers)))


def job_spec(
    *,
    dataset_id: str,
    noise_multiplier: float,
    steps: int,
    model: dict[str, Any] = LOGISTIC,
    delta: float | None = None,
    time_limit_s: float | None = None,
) -> dict[str, Any]:
    privacy: dict[str, Any] = {"noise_multiplier": noise_multiplier}
    if delta is not None:
        privacy["delta"] = delta
    training: dict[str, Any] = {"steps": steps, "batch_size": 64, "learning_rate": 0.5}
    if time_limit_s is not None:
        training["time_limit_s"] = time_limit_s
    return {
        "dataset_id": dataset_id,
        "model": model,
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": privacy,
        "training": training,
    }


def csv_variant(csv: bytes, tag: str) -> bytes:
    """The same rows with a renamed first column: new bytes, so no 409 already-registered."""
    return csv.replace(b"x0,", f"x0_{tag},".encode(), 1)


def upload_params(*, name: str, fmt: str = "csv", delta: float = 1e-6) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "format": fmt, "epsilon": 1.0, "delta": delta}
    if fmt == "csv":
        params["label_column"] = "label"
    return params


def expect_refused(record: AttackRecord, *, label: str) -> None:
    """A finding if anything under `label` was accepted (2xx)."""
    accepted = sum(n for outcome, n in record.label_outcomes(label).items() if outcome[:1] == "2")
    if accepted:
        record.problems.append(f"{label}: accepted {accepted}× (expected a 4xx)")


def expect_seen(record: AttackRecord, *, label: str, outcome: str, meaning: str) -> None:
    """A finding if `outcome` never appeared under `label` (a protection that did not show)."""
    if not any(seen.startswith(outcome) for seen in record.label_outcomes(label)):
        record.problems.append(f"{label}: no '{outcome}' seen ({meaning})")


# ----------------------------------------------------------------------------- the attacks


@attack("idle")
async def idle(ctx: AttackContext, record: AttackRecord) -> None:
    """No attack: the bystander's figures at rest, for reference."""
    await asyncio.sleep(ctx.remaining_s())


TINY_SIGMAS = (1e-300, 1e-200, 0.01)


@attack("tiny-sigma")
async def tiny_sigma(ctx: AttackContext, record: AttackRecord) -> None:
    """40 concurrent estimates with σ = 1e-300, 1e-200, 0.01 in a loop."""
    async with ctx.client() as http:

        async def one(n: int) -> None:
            sigma = TINY_SIGMAS[n % len(TINY_SIGMAS)]
            spec = job_spec(dataset_id=ctx.dataset_id, noise_multiplier=sigma, steps=1000)
            await send(
                http, record, label=f"estimate σ={sigma:g}", method="POST", url="/v1/jobs/estimate", json_body=spec
            )

        await repeat_until(ctx.until, workers=40, body=one)
    for sigma in TINY_SIGMAS[:2]:
        expect_refused(record, label=f"estimate σ={sigma:g}")


PRV_HEAVY = (("σ=0.6 T=1e6", 0.6, 1_000_000), ("σ=0.01 T=1000", 0.01, 1000))


@attack("prv-heavy")
async def prv_heavy(ctx: AttackContext, record: AttackRecord) -> None:
    """20 concurrent estimates and submissions whose single-job ε bound used to run for seconds."""
    async with ctx.client() as http:

        async def one(n: int) -> None:
            name, sigma, steps = PRV_HEAVY[n % len(PRV_HEAVY)]
            spec = job_spec(dataset_id=ctx.dataset_id, noise_multiplier=sigma, steps=steps)
            if (n // len(PRV_HEAVY)) % 2:
                await send(http, record, label=f"submit {name}", method="POST", url="/v1/jobs", json_body=spec)
            else:
                await send(
                    http, record, label=f"estimate {name}", method="POST", url="/v1/jobs/estimate", json_body=spec
                )

        await repeat_until(ctx.until, workers=20, body=one)


SSE_STREAMS = 150


async def _submit_long_job(ctx: AttackContext, record: AttackRecord) -> str | None:
    """A job that stays queued or running for the whole attack (cancelled between attacks)."""
    async with ctx.client(key=ctx.admin_key) as http:
        spec = job_spec(dataset_id=ctx.dataset_id, noise_multiplier=50.0, steps=200_000, time_limit_s=300)
        response = await send(http, record, label="setup: long job", method="POST", url="/v1/jobs", json_body=spec)
    if response is None or response.status_code != 202:
        record.problems.append("could not submit the long job the streams watch")
        return None
    return str(response.json()["id"])


async def _hold_stream(
    http: httpx.AsyncClient, record: AttackRecord, *, url: str, until: float, held: list[int]
) -> None:
    """Open one event stream and keep reading it until the deadline."""
    label = "SSE stream"
    request = http.build_request("GET", url, headers={"Accept": "text/event-stream"})
    try:
        async with asyncio.timeout(ATTACK_TIMEOUT_S):
            response = await http.send(request, stream=True)
    except TimeoutError:
        record.count(label=label, outcome="timeout")
        return
    except httpx.TransportError as exc:
        record.count(label=label, outcome=f"error {type(exc).__name__}")
        return
    try:
        record.count(label=label, outcome=await outcome_of(response))
        if response.status_code == 200:
            await _read_until(response, until=until, held=held)
    finally:
        await response.aclose()


async def _read_until(response: httpx.Response, *, until: float, held: list[int]) -> None:
    try:
        async with asyncio.timeout(max(0.0, until - time.monotonic())):
            async for _ in response.aiter_bytes():
                pass
    except TimeoutError:
        held.append(1)  # still open at the deadline: the stream was held for the whole attack
    except httpx.TransportError:
        pass  # the server ended it: not a hang, the attacker simply lost the stream


async def _note_job_state(ctx: AttackContext, record: AttackRecord, job_id: str) -> None:
    """Whether the long job was really training while the attack ran (the worker may lag)."""
    async with ctx.client(key=ctx.admin_key) as http:
        response = await http.get(f"/v1/jobs/{job_id}")
    job = response.json() if response.status_code == 200 else {}
    record.notes.append(
        f"the long job was {job.get('status', 'unknown')} at the end ({job.get('steps_run', '?')} steps run)"
    )


@attack("training")
async def training(ctx: AttackContext, record: AttackRecord) -> None:
    """No attack: one of A's jobs trains on the embedded worker (the reference for sse-flood)."""
    job_id = await _submit_long_job(ctx, record)
    await asyncio.sleep(ctx.remaining_s())
    if job_id is not None:
        await _note_job_state(ctx, record, job_id)


@attack("sse-flood")
async def sse_flood(ctx: AttackContext, record: AttackRecord) -> None:
    """150 concurrent SSE streams on one of A's live jobs, held open."""
    job_id = await _submit_long_job(ctx, record)
    if job_id is None:
        return
    held: list[int] = []
    async with ctx.client(read_timeout_s=None) as http:
        await asyncio.gather(
            *(
                _hold_stream(http, record, url=f"/v1/jobs/{job_id}/events", until=ctx.until, held=held)
                for _ in range(SSE_STREAMS)
            )
        )
    record.notes.append(f"{len(held)} of {SSE_STREAMS} streams were still open at the end of the attack")
    await _note_job_state(ctx, record, job_id)


SMALL_JOBS = 3
UPLOADERS = 12


@attack("upload-lock")
async def upload_lock(ctx: AttackContext, record: AttackRecord) -> None:
    """12 concurrent uploads by A in a loop while the worker runs and commits 3 of A's jobs."""
    async with ctx.client(read_timeout_s=60.0) as http:
        for _ in range(SMALL_JOBS):
            spec = job_spec(dataset_id=ctx.dataset_id, noise_multiplier=20.0, steps=300)
            await send(http, record, label="submit small job", method="POST", url="/v1/jobs", json_body=spec)

        async def one(n: int) -> None:
            await send(
                http,
                record,
                label="upload",
                method="POST",
                url="/v1/datasets",
                params=upload_params(name=f"lock{n}"),
                content=csv_variant(ctx.digits_csv, f"{n}_{secrets.token_hex(3)}"),
            )

        await repeat_until(ctx.until, workers=UPLOADERS, body=one)
    expect_seen(record, label="upload", outcome="429 too-many-uploads", meaning="no concurrent-upload cap")


async def _budget(ctx: AttackContext) -> dict[str, Any] | None:
    async with ctx.client(key=ctx.admin_key) as http:
        response = await http.get(f"/v1/datasets/{ctx.dataset_id}/budget")
    return response.json() if response.status_code == 200 else None


@attack("big-model")
async def big_model(ctx: AttackContext, record: AttackRecord) -> None:
    """An MLP of 8 × 16384 hidden units: one submission, then estimates in a loop."""
    before = await _budget(ctx)
    spec = job_spec(dataset_id=ctx.dataset_id, noise_multiplier=20.0, steps=100, model=HUGE_MLP)
    async with ctx.client() as http:
        await send(http, record, label="submit", method="POST", url="/v1/jobs", json_body=spec)

        async def one(_n: int) -> None:
            await send(http, record, label="estimate", method="POST", url="/v1/jobs/estimate", json_body=spec)

        await repeat_until(ctx.until, workers=4, body=one)
    after = await _budget(ctx)
    expect_refused(record, label="submit")
    expect_refused(record, label="estimate")
    if before is None or after is None or before != after:
        record.problems.append("A's budget changed (or could not be read) across the attack")
    else:
        record.notes.append(
            f"A's budget unchanged: reserved ε {after['reserved_epsilon']:g}, "
            f"{after['entries']} ledger entries before and after"
        )


@attack("npz-bomb")
async def npz_bomb(ctx: AttackContext, record: AttackRecord) -> None:
    """A ~1 MB NPZ declaring over 1 GiB of zeros, uploaded by 2 clients in a loop."""
    before = api_memory(ctx.api_pid)
    slowest: list[float] = [0.0]
    async with ctx.client() as http:

        async def one(n: int) -> None:
            started = time.perf_counter()
            await send(
                http,
                record,
                label="upload bomb",
                method="POST",
                url="/v1/datasets",
                params=upload_params(name=f"bomb{n}", fmt="npz"),
                content=ctx.npz_bomb,
            )
            slowest[0] = max(slowest[0], time.perf_counter() - started)

        await repeat_until(ctx.until, workers=2, body=one)
    after = api_memory(ctx.api_pid)
    expect_refused(record, label="upload bomb")
    record.notes.append(
        f"bomb {len(ctx.npz_bomb) / 2**20:.1f} MiB on the wire, {bomb_declared_bytes() / 2**30:.2f} GiB "
        f"declared; API RSS {before.rss_mib:.0f} → {after.rss_mib:.0f} MiB, peak (VmHWM) "
        f"{before.peak_mib:.0f} → {after.peak_mib:.0f} MiB; slowest answer {slowest[0]:.2f} s"
    )
    if slowest[0] > QUICK_REFUSAL_S:
        record.problems.append(f"a bomb upload took {slowest[0]:.1f} s to answer")


COOKIE_REQUESTS = 400
CSRF_FIELD = re.compile(r'name="csrf_token"\s+value="([^"]+)"')


async def _dashboard_login(http: httpx.AsyncClient, record: AttackRecord, *, key: str) -> bool:
    """Log in through the HTML form as a browser does (cookie jar, CSRF field)."""
    form = await send(http, record, label="login", method="GET", url="/ui/login")
    match = CSRF_FIELD.search(form.text) if form is not None else None
    if match is None:
        record.problems.append("no CSRF field found on /ui/login")
        return False
    answer = await send(
        http, record, label="login", method="POST", url="/ui/login", data={"csrf_token": match.group(1), "api_key": key}
    )
    if answer is None or answer.status_code != 303:
        record.problems.append("the dashboard login did not answer 303")
        return False
    return True


def _default_setting(name: str) -> float:
    return float(Settings.model_fields[name].default)


def excess_requests(*, requests: int, elapsed_s: float) -> float:
    """Requests beyond what the default token bucket lets through in `elapsed_s`: how many 429s a
    limited principal must get at least (0: the burst alone explains every answer)."""
    burst = _default_setting("rate_limit_burst")
    refill = _default_setting("rate_limit_per_minute") / 60.0 * elapsed_s
    return max(0.0, requests - burst - refill)


@attack("cookie-rate", tenant="third")
async def cookie_rate(ctx: AttackContext, record: AttackRecord) -> None:
    """Tenant C logs in to the dashboard, then fires 400 cookie requests, 20 at a time."""
    label = "GET /ui/datasets by cookie"
    async with ctx.client(authorised=False) as http:
        if not await _dashboard_login(http, record, key=ctx.attacker_key):
            return
        budget = iter(range(COOKIE_REQUESTS))
        started = time.monotonic()

        async def worker() -> None:
            for _ in budget:
                await send(http, record, label=label, method="GET", url="/ui/datasets")

        await asyncio.gather(*(worker() for _ in range(20)))
        elapsed = time.monotonic() - started
    excess = excess_requests(requests=COOKIE_REQUESTS, elapsed_s=elapsed)
    record.notes.append(
        f"{COOKIE_REQUESTS} cookie requests in {elapsed:.1f} s; a key limited like a Bearer "
        f"key must have got at least {excess:.0f} × 429"
    )
    limited = sum(n for outcome, n in record.label_outcomes(label).items() if outcome.startswith("429"))
    if limited < excess:
        record.problems.append(f"{label}: {limited} × 429, fewer than the bucket allows ({excess:.0f})")
    expect_seen(record, label=label, outcome="200", meaning="the session cookie was not accepted")


def _answer_shape(response: httpx.Response | None) -> tuple[str, ...]:
    """Status and top-level body keys (and a problem's type): what tells two answers apart."""
    if response is None:
        return ("no answer",)
    try:
        body = response.json()
    except ValueError:
        return (str(response.status_code), "not JSON")
    keys = sorted(body) if isinstance(body, dict) else [type(body).__name__]
    kind = [str(body["type"])] if isinstance(body, dict) and "type" in body else []
    return (str(response.status_code), *kind, *keys)


@attack("grant-enum")
async def grant_enum(ctx: AttackContext, record: AttackRecord) -> None:
    """Grants on A's dataset to existing tenants and to an unknown name: do the answers differ?"""
    unknown = f"ghost-{secrets.token_hex(4)}"
    names = {"existing (B)": ctx.bystander_name, "existing (C)": ctx.third_name, "unknown": unknown}
    shapes: dict[str, tuple[str, ...]] = {}
    async with ctx.client() as http:
        for label, name in names.items():
            response = await send(
                http,
                record,
                label=f"grant to {label}",
                method="POST",
                url=f"/v1/datasets/{ctx.dataset_id}/grants",
                json_body={"tenant": name},
            )
            shapes[label] = _answer_shape(response)
    async with ctx.client(key=ctx.admin_key) as admin:
        for name in (ctx.bystander_name, ctx.third_name):
            await admin.delete(f"/v1/datasets/{ctx.dataset_id}/grants/{name}")
    for label, shape in shapes.items():
        record.notes.append(f"grant to {label}: {' '.join(shape)}")
    if shapes["existing (B)"] != shapes["unknown"]:
        record.problems.append(
            "enumeration oracle: an existing tenant's name and an unknown name get different answers"
        )
    await asyncio.sleep(min(2.0, ctx.remaining_s()))


TINY_DELTA = 5e-324


async def _after_tiny_delta(ctx: AttackContext, record: AttackRecord) -> None:
    """The pages a 5e-324 δ used to break must still answer 200."""
    async with ctx.client(key=ctx.admin_key) as http:
        for label, url in (
            ("after: GET /metrics", "/metrics"),
            ("after: GET budget", f"/v1/datasets/{ctx.dataset_id}/budget"),
            ("after: GET ledger", f"/v1/datasets/{ctx.dataset_id}/ledger"),
        ):
            response = await send(http, record, label=label, method="GET", url=url)
            if response is None or response.status_code != 200:
                record.problems.append(f"{label} did not answer 200")


@attack("tiny-delta")
async def tiny_delta(ctx: AttackContext, record: AttackRecord) -> None:
    """An upload and jobs with δ = 5e-324; then /metrics and A's budget and ledger pages."""
    async with ctx.client() as http:
        await send(
            http,
            record,
            label="upload δ=5e-324",
            method="POST",
            url="/v1/datasets",
            params=upload_params(name="tiny-delta", delta=TINY_DELTA),
            content=csv_variant(ctx.digits_csv, secrets.token_hex(4)),
        )

        async def one(n: int) -> None:
            spec = job_spec(dataset_id=ctx.dataset_id, noise_multiplier=20.0, steps=100, delta=TINY_DELTA)
            route, url = ("submit", "/v1/jobs") if n % 2 else ("estimate", "/v1/jobs/estimate")
            await send(http, record, label=f"{route} δ=5e-324", method="POST", url=url, json_body=spec)

        await repeat_until(ctx.until, workers=4, body=one)
    for label in ("upload δ=5e-324", "estimate δ=5e-324", "submit δ=5e-324"):
        expect_refused(record, label=label)
    await _after_tiny_delta(ctx, record)


SLOW_UPLOADS = 30
SLOW_BYTES_PER_S = 4
SLOW_DECLARED_BYTES = 100_000


def _slow_upload_head(ctx: AttackContext, *, n: int) -> bytes:
    query = httpx.QueryParams(upload_params(name=f"slow{n}"))
    host = ctx.base.removeprefix("http://")
    return (
        f"POST /v1/datasets?{query} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {ctx.attacker_key}\r\nContent-Type: text/csv\r\n"
        f"Content-Length: {SLOW_DECLARED_BYTES}\r\n\r\n"
    ).encode()


async def _slow_upload(ctx: AttackContext, *, n: int) -> tuple[str, float]:
    """Send a few bytes a second until the server answers or closes; (outcome, seconds)."""
    host, port = ctx.base.removeprefix("http://").split(":")
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(_slow_upload_head(ctx, n=n))
        body = memoryview(ctx.digits_csv)
        offset = 0
        while time.monotonic() < ctx.until:
            try:
                writer.write(body[offset : offset + SLOW_BYTES_PER_S])
                await writer.drain()
                offset += SLOW_BYTES_PER_S
                answer = await asyncio.wait_for(reader.read(4096), timeout=1.0)
            except TimeoutError:
                continue
            except OSError:
                return "closed", time.monotonic() - started
            if not answer:
                return "closed", time.monotonic() - started
            return _status_line_code(answer), time.monotonic() - started
        return "open at the end", time.monotonic() - started
    finally:
        writer.close()


def _status_line_code(answer: bytes) -> str:
    parts = answer.split(b"\r\n", 1)[0].split()
    return parts[1].decode() if len(parts) > 1 and parts[1].isdigit() else "garbled answer"


def _tmp_files(data_dir: Path) -> int:
    tmp = data_dir / "tmp"
    return sum(1 for _ in tmp.iterdir()) if tmp.is_dir() else 0


@attack("slow-upload", min_seconds=25.0)
async def slow_upload(ctx: AttackContext, record: AttackRecord) -> None:
    """30 uploads at 4 bytes/s on raw sockets: are they cut off, and is their temp file removed?"""
    outcomes = await asyncio.gather(*(_slow_upload(ctx, n=n) for n in range(SLOW_UPLOADS)), return_exceptions=True)
    cut_after: list[float] = []
    for result in outcomes:
        if isinstance(result, BaseException):
            record.count(label="slow upload", outcome=f"error {type(result).__name__}")
            continue
        outcome, seconds = result
        record.count(label="slow upload", outcome=outcome)
        if outcome != "429":
            cut_after.append(seconds)
    await asyncio.sleep(2.0)  # let the server finish whatever clean-up follows a cut
    left = _tmp_files(ctx.data_dir)
    cut = ", ".join(f"{s:.1f}" for s in sorted(cut_after)) or "none"
    record.notes.append(
        f"slow uploads not refused at once ended after [{cut}] s; {left} file(s) left in the data dir's tmp/ afterwards"
    )
    if record.label_outcomes("slow upload").get("open at the end"):
        record.problems.append("some slow uploads were still open at the end of the attack")
    if left:
        record.problems.append(f"{left} temporary upload file(s) left behind")


CRAFTED_CURSORS = (["abc"], [2**70], ["2020-01-01", {"x": 1}])


@attack("crafted-cursor")
async def crafted_cursor(ctx: AttackContext, record: AttackRecord) -> None:
    """Hostile cursors on the datasets, ledger and jobs listings, 4 clients in a loop."""
    paths = ("/v1/datasets", f"/v1/datasets/{ctx.dataset_id}/ledger", "/v1/jobs")
    cases = [(json.dumps(values), encode_cursor(values), path) for values in CRAFTED_CURSORS for path in paths]
    async with ctx.client() as http:

        async def one(n: int) -> None:
            shown, cursor, path = cases[n % len(cases)]
            await send(http, record, label=f"cursor {shown}", method="GET", url=path, params={"cursor": cursor})

        await repeat_until(ctx.until, workers=4, body=one)
    record.notes.append("cursors sent to " + ", ".join(paths))
    for label, counts in record.statuses.items():
        unexpected = {o: n for o, n in counts.items() if not o.startswith(("422", "429"))}
        if unexpected:
            record.problems.append(f"{label}: answers other than 422/429: {unexpected}")


FLOOD_WORKERS = 30
FLOOD_KEYS = 6


def flood_pages(dataset_id: str) -> tuple[str, ...]:
    """Dashboard and API pages of A's own data: ordinary, authorised GETs."""
    return (
        "/ui/datasets",
        f"/ui/datasets/{dataset_id}",
        "/ui/jobs",
        "/v1/datasets",
        f"/v1/datasets/{dataset_id}/ledger",
        "/v1/jobs",
    )


def retry_after_s(response: httpx.Response | None) -> float:
    """The wait a 429 asks for (1 s when it names none); 0 for any other answer."""
    if response is None or response.status_code != 429:
        return 0.0
    try:
        return max(0.0, float(response.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


async def _flood_gets(
    ctx: AttackContext, record: AttackRecord, *, clients: Sequence[httpx.AsyncClient], pages: Sequence[str]
) -> int:
    """FLOOD_WORKERS loops of GETs over `pages`, worker i on client i mod len(clients), each loop
    waiting out a 429's Retry-After as a well-behaved client would (the flood stays under the
    rate limit: what it spends is concurrency, not request count). Returns the requests sent."""
    sent = [0]

    async def loop(worker: int) -> None:
        http = clients[worker % len(clients)]
        n = worker
        while time.monotonic() < ctx.until:
            url = pages[n % len(pages)]
            n += FLOOD_WORKERS
            response = await send(http, record, label=f"GET {url.split('/')[1]}", method="GET", url=url)
            sent[0] += 1
            await asyncio.sleep(min(retry_after_s(response), ctx.remaining_s()))

    await asyncio.gather(*(loop(worker) for worker in range(FLOOD_WORKERS)))
    return sent[0]


def _note_rate(record: AttackRecord, *, requests: int, seconds: float) -> None:
    per_s = requests / max(seconds, 1e-9)
    limit = _default_setting("rate_limit_per_minute") / 60.0
    record.notes.append(f"{requests} requests in {seconds:.0f} s ({per_s:.1f}/s; the rate limit refills {limit:g}/s)")


@attack("get-flood", needs_history=True)
async def get_flood(ctx: AttackContext, record: AttackRecord) -> None:
    """One key: 30 concurrent dashboard and API GETs of its own pages in a loop."""
    started = time.monotonic()
    async with ctx.client() as http:
        sent = await _flood_gets(ctx, record, clients=[http], pages=flood_pages(ctx.dataset_id))
    _note_rate(record, requests=sent, seconds=time.monotonic() - started)
    for label in ("GET ui", "GET v1"):
        expect_seen(record, label=label, outcome="200", meaning="the flood's own pages never answered")
    expect_seen(
        record, label="GET v1", outcome="429 too-many-concurrent-requests", meaning="no per-principal concurrency cap"
    )


@attack("get-flood-keys", keys=FLOOD_KEYS, needs_history=True)
async def get_flood_keys(ctx: AttackContext, record: AttackRecord) -> None:
    """One tenant, 6 keys: the same 30 concurrent GETs spread 5 per key (a per-key cap alone is bypassed)."""
    started = time.monotonic()
    keys = (ctx.attacker_key, *ctx.extra_attacker_keys)
    clients = [ctx.client(key=key) for key in keys]
    try:
        sent = await _flood_gets(ctx, record, clients=clients, pages=flood_pages(ctx.dataset_id))
    finally:
        for http in clients:
            await http.aclose()
    _note_rate(record, requests=sent, seconds=time.monotonic() - started)
    expect_seen(
        record, label="GET v1", outcome="429 too-many-concurrent-requests", meaning="no per-tenant concurrency cap"
    )


@attack("bad-key-flood")
async def bad_key_flood(ctx: AttackContext, record: AttackRecord) -> None:
    """30 concurrent GETs, each with a fresh random key, from the bystander's own address."""
    started = time.monotonic()
    sent = [0]
    async with ctx.client(authorised=False) as http:

        async def loop(_worker: int) -> None:
            while time.monotonic() < ctx.until:
                response = await send(
                    http,
                    record,
                    label="GET v1 bad key",
                    method="GET",
                    url="/v1/datasets",
                    headers={"Authorization": f"Bearer pt_{secrets.token_urlsafe(32)}"},
                )
                sent[0] += 1
                await asyncio.sleep(min(retry_after_s(response), ctx.remaining_s()))

        await asyncio.gather(*(loop(worker) for worker in range(FLOOD_WORKERS)))
    _note_rate(record, requests=sent[0], seconds=time.monotonic() - started)
    expect_refused(record, label="GET v1 bad key")
    record.notes.append("the probe's bystander key comes from the same loopback address as the flood")


# ----------------------------------------------------------------------------- bystander probe


async def _timed_get(http: httpx.AsyncClient, url: str, *, origin: float, samples: list[Sample]) -> None:
    started = time.perf_counter()
    sent_at = round(time.monotonic() - origin, 3)
    try:
        response = await http.get(url)
    except httpx.HTTPError as exc:
        samples.append(Sample(sent_at, PROBE_TIMEOUT_S, False, f"error {type(exc).__name__}"))
        return
    latency = time.perf_counter() - started
    samples.append(Sample(sent_at, latency, response.status_code == 200, await outcome_of(response)))


async def _probe_loop(http: httpx.AsyncClient, *, url: str, every_s: float, stop: Any, samples: list[Sample]) -> None:
    """Open loop: a probe every `every_s` on schedule, however slow earlier ones are."""
    pending: set[asyncio.Task[None]] = set()
    next_at = origin = time.monotonic()
    while not stop.is_set():
        task = asyncio.create_task(_timed_get(http, url, origin=origin, samples=samples))
        pending.add(task)
        task.add_done_callback(pending.discard)
        next_at = max(next_at + every_s, time.monotonic() - every_s)
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.gather(*pending)


async def _probe(*, base: str, bystander_key: str, stop: Any) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {"healthz": [], "bystander": []}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=50)
    async with (
        httpx.AsyncClient(base_url=base, timeout=PROBE_TIMEOUT_S, limits=limits) as health,
        httpx.AsyncClient(
            base_url=base, timeout=PROBE_TIMEOUT_S, limits=limits, headers={"Authorization": f"Bearer {bystander_key}"}
        ) as bystander,
    ):
        await asyncio.gather(
            _probe_loop(health, url="/healthz", every_s=HEALTHZ_EVERY_S, stop=stop, samples=samples["healthz"]),
            _probe_loop(
                bystander, url="/v1/datasets", every_s=BYSTANDER_EVERY_S, stop=stop, samples=samples["bystander"]
            ),
        )
    return samples


def _probe_main(base: str, bystander_key: str, stop: Any, results: Any) -> None:
    results.put(asyncio.run(_probe(base=base, bystander_key=bystander_key, stop=stop)))


@contextmanager
def bystander_probe(*, base: str, bystander_key: str) -> Iterator[dict[str, list[Sample]]]:
    """Probe in a child process for the duration of the block; the samples fill the yielded dict."""
    context = multiprocessing.get_context("fork")
    stop, results = context.Event(), context.Queue()
    process = context.Process(target=_probe_main, args=(base, bystander_key, stop, results), daemon=True)
    process.start()
    collected: dict[str, list[Sample]] = {}
    try:
        yield collected
    finally:
        stop.set()
        collected.update(results.get(timeout=PROBE_TIMEOUT_S + 30))
        process.join(timeout=10)


# ----------------------------------------------------------------------------- the service


@dataclass(frozen=True)
class MemoryFigures:
    rss_mib: float
    peak_mib: float


def _status_field_kib(pid: int, name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every live descendant process of `pid` (from /proc's children lists)."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(child) for child in children.read_text().split()]
            except OSError:
                continue
            found += kids
            frontier += kids
    return found


def api_memory(pid: int) -> MemoryFigures:
    """The API process's resident and peak memory (the worker's is a separate process)."""
    return MemoryFigures(
        rss_mib=_status_field_kib(pid, "VmRSS") / 1024, peak_mib=_status_field_kib(pid, "VmHWM") / 1024
    )


def tree_rss_mib(pid: int) -> float:
    return sum(_status_field_kib(p, "VmRSS") for p in [pid, *descendants(pid)]) / 1024


def _serve_command(port: int) -> list[str]:
    script = Path(sys.executable).with_name("privtrain-admin")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "admin.cli"]
    return [*command, "serve", "--port", str(port)]


def _serve_env(data_dir: Path, overrides: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without PRIVTRAIN_* settings: every protection at its default,
    unless ``--setting`` overrides one (the report's first line names them)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PRIVTRAIN_")}
    chosen = {f"PRIVTRAIN_{name.upper()}": value for name, value in overrides.items()}
    return {**env, **chosen, "PRIVTRAIN_DATA_DIR": str(data_dir), "PRIVTRAIN_LOG_LEVEL": "WARNING"}


def _wait_healthy(base: str, *, server: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit("the API did not start; its log ends with:\n" + log_path.read_text()[-3000:])


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks: with the pid, it names one process (no pid reuse)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _identities(pids: set[int]) -> set[tuple[int, str]]:
    return {(pid, start) for pid in pids if (start := _start_time(pid)) is not None}


def _kill_tree(server: subprocess.Popen[bytes], family: set[tuple[int, str]]) -> None:
    """SIGTERM the serve process (it stops its worker), then SIGKILL every group left: the worker
    runs in its own session, so killing serve's process group alone would leave it behind."""
    family |= _identities({server.pid, *descendants(server.pid)})
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            server.wait(timeout=25)
    own_group = os.getpgrp()
    for pid, start in sorted(family):
        if _start_time(pid) != start:
            continue  # gone (or the pid now names another process)
        try:
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if server.poll() is None:
        server.wait(timeout=10)


@dataclass(frozen=True)
class RunningApi:
    base: str
    pid: int
    log_path: Path


@contextmanager
def served_api(*, data_dir: Path, log_path: Path, overrides: Mapping[str, str]) -> Iterator[RunningApi]:
    """`privtrain-admin serve` (embedded: SQLite, filesystem broker, one worker), cleaned up."""
    port = _free_port()
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            _serve_command(port),
            cwd=REPO_ROOT,
            env=_serve_env(data_dir, overrides),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    family: set[tuple[int, str]] = set()
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, server=server, log_path=log_path)
        family |= _identities(set(descendants(server.pid)))
        yield RunningApi(base=base, pid=server.pid, log_path=log_path)
    finally:
        _kill_tree(server, family)


@dataclass(frozen=True)
class Principals:
    admin_key: str
    bystander_key: str
    attack_keys: dict[str, tuple[str, ...]]
    """Per attack, its fresh keys (one unless the attack asks for more)."""


def create_principals(data_dir: Path, *, attacks: Sequence[Attack]) -> Principals:
    """Migrate the embedded database and create A (a setup key), B, C and one key per attack."""
    settings = Settings(data_dir=data_dir, database_url=None, broker_url=None)
    migrate(settings)
    db = Database(settings.resolved_database_url)
    keys: dict[str, str] = {}
    try:
        with db.write_transaction() as session:
            tenants = {role: get_or_create_tenant(session, name) for role, name in TENANTS.items()}
            for label, role in [
                ("setup", "attacker"),
                ("bystander", "bystander"),
                ("third", "third"),
                *((f"attack:{spec.name}:{n}", spec.tenant) for spec in attacks for n in range(spec.keys)),
            ]:
                keys[label] = generate_api_key()
                register_api_key(session, tenant=tenants[role], key=keys[label], label=label)
    finally:
        db.dispose()
    return Principals(
        admin_key=keys["setup"],
        bystander_key=keys["bystander"],
        attack_keys={spec.name: tuple(keys[f"attack:{spec.name}:{n}"] for n in range(spec.keys)) for spec in attacks},
    )


HISTORY_JOBS = 200


def build_history(base: str, *, key: str, dataset_id: str, jobs: int = HISTORY_JOBS) -> None:
    """Give A's dataset the history a service in use has: `jobs` submissions, each cancelled at
    once (a reservation and its release in the ledger, a row in the jobs list), so the pages the
    GET floods read cost what they cost in use, not what they cost on an empty service."""
    spec = job_spec(dataset_id=dataset_id, noise_multiplier=20.0, steps=5)

    def post(http: httpx.Client, url: str, body: Any = None) -> httpx.Response:
        while (response := http.post(url, json=body)).status_code == 429:  # the setup key's rate limit
            time.sleep(retry_after_s(response))
        return response

    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        for _ in range(jobs):
            submitted = post(http, "/v1/jobs", spec)
            if submitted.status_code != 202:
                raise SystemExit(f"history submission failed: {submitted.status_code} {submitted.text[:500]}")
            post(http, f"/v1/jobs/{submitted.json()['id']}/cancel")


def upload_digits(base: str, *, key: str, name: str, csv: bytes) -> str:
    response = httpx.post(
        f"{base}/v1/datasets",
        headers={"Authorization": f"Bearer {key}"},
        content=csv,
        params={"name": name, "format": "csv", "label_column": "label", "epsilon": 100, "delta": 1e-5},
        timeout=120,
    )
    if response.status_code != 201:
        raise SystemExit(f"setup upload failed: {response.status_code} {response.text[:500]}")
    return str(response.json()["id"])


# ----------------------------------------------------------------------------- fixtures


def bomb_declared_bytes() -> int:
    return (BOMB_ROWS * BOMB_COLS + BOMB_ROWS) * 8


def _write_zero_member(archive: zipfile.ZipFile, *, name: str, shape: tuple[int, ...]) -> None:
    chunk = memoryview(bytes(16 * 2**20))
    with archive.open(name, "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": shape})
        remaining = math.prod(shape) * 8
        while remaining:
            size = min(remaining, len(chunk))
            member.write(chunk[:size])
            remaining -= size


def build_npz_bomb() -> bytes:
    """X (131072 × 1024 float64) and y of zeros, deflated: ~1 MB holding over 1 GiB."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        _write_zero_member(archive, name="X.npy", shape=(BOMB_ROWS, BOMB_COLS))
        _write_zero_member(archive, name="y.npy", shape=(BOMB_ROWS,))
    return buffer.getvalue()


# ----------------------------------------------------------------------------- orchestration


def _jobs_of(client: httpx.Client, status: str) -> list[str]:
    response = client.get("/v1/jobs", params={"status": status, "limit": 200})
    return [item["id"] for item in response.json().get("items", [])] if response.status_code == 200 else []


def _cancel_active_jobs(client: httpx.Client) -> None:
    """Cancel A's queued and running jobs and wait (bounded) until none runs."""
    for status in ("queued", "running"):
        for job_id in _jobs_of(client, status):
            client.post(f"/v1/jobs/{job_id}/cancel")
    deadline = time.monotonic() + 60
    while _jobs_of(client, "running") and time.monotonic() < deadline:
        time.sleep(1.0)


def _quick(client: httpx.Client, url: str) -> bool:
    started = time.perf_counter()
    try:
        ok = client.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
    return ok and time.perf_counter() - started < 0.25


SETTLE_LIMIT_S = 90.0


def settle(*, base: str, principals: Principals) -> list[str]:
    """Between attacks: no job of A left active, and the service answering fast again (three
    quick answers in a row). Returns a note when that took long or never happened, since the
    previous attack's leftover work then weighs on the next one's figures."""
    started = time.monotonic()
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {principals.admin_key}"}, timeout=30) as admin:
        _cancel_active_jobs(admin)
    streak = 0
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {principals.bystander_key}"}) as client:
        while streak < 3 and time.monotonic() - started < SETTLE_LIMIT_S:
            streak = streak + 1 if _quick(client, "/healthz") and _quick(client, "/v1/datasets") else 0
            time.sleep(0.2)
    waited = time.monotonic() - started
    if streak < 3:
        return [f"the service was still slow {waited:.0f} s after the previous attack (figures include it)"]
    return [f"the service took {waited:.0f} s to settle after the previous attack"] if waited > 5 else []


@dataclass(frozen=True)
class AttackResult:
    name: str
    summary: str
    seconds: float
    statuses: dict[str, dict[str, int]]
    notes: list[str]
    problems: list[str]
    healthz: LatencySummary
    bystander: LatencySummary
    verdict: str
    api_tree_rss_mib: tuple[float, float]
    samples: dict[str, list[tuple[float, float, bool, str]]]
    """Per probe kind: (sent at s, latency ms, ok, outcome) in the order the answers came."""


async def _bounded(spec: Attack, ctx: AttackContext, record: AttackRecord) -> None:
    try:
        async with asyncio.timeout(ctx.remaining_s() + ATTACK_OVERRUN_S):
            await spec.run(ctx, record)
    except TimeoutError:
        record.problems.append(f"the attack itself overran its window by {ATTACK_OVERRUN_S:g} s")


def run_attack(
    spec: Attack,
    *,
    ctx_for: Callable[[float], AttackContext],
    seconds: float,
    base: str,
    bystander_key: str,
    api_pid: int,
    notes: Sequence[str],
) -> AttackResult:
    """One attack with the probe watching; the attack's window is max(seconds, its minimum)."""
    window = max(seconds, spec.min_seconds)
    record = AttackRecord(notes=list(notes))
    rss_before = tree_rss_mib(api_pid)
    started = time.monotonic()
    with bystander_probe(base=base, bystander_key=bystander_key) as samples:
        asyncio.run(_bounded(spec, ctx_for(started + window), record))
    elapsed = time.monotonic() - started
    healthz, bystander = LatencySummary.of(samples["healthz"]), LatencySummary.of(samples["bystander"])
    for kind, probes in samples.items():
        failed = Counter(sample.outcome for sample in probes if not sample.ok)
        if failed:
            record.notes.append(f"{kind} probe failures: {format_outcomes({'got': failed}).removeprefix('got: ')}")
    return AttackResult(
        name=spec.name,
        summary=spec.summary,
        seconds=elapsed,
        statuses={label: dict(counts) for label, counts in record.statuses.items()},
        notes=record.notes,
        problems=record.problems,
        healthz=healthz,
        bystander=bystander,
        verdict=verdict(
            healthz_p99_ms=healthz.p99_ms,
            bystander_p99_ms=bystander.p99_ms,
            outcomes=record.outcomes(),
            problems=record.problems,
        ),
        api_tree_rss_mib=(rss_before, tree_rss_mib(api_pid)),
        samples={
            kind: [(s.sent_at_s, round(1e3 * s.latency_s, 2), s.ok, s.outcome) for s in values]
            for kind, values in samples.items()
        },
    )


def print_report(results: Sequence[AttackResult], *, started: float, overrides: Mapping[str, str]) -> None:
    chosen = ", ".join(f"{name}={value}" for name, value in overrides.items()) or "every setting at its default"
    print(
        f"# attack run {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()} ({os.cpu_count()} cores, "
        f"{platform.platform()}), {time.monotonic() - started:.0f} s in all; {chosen}"
    )
    print(
        "| attack | attacker got | healthz p50 / p99 / max ms | bystander p50 / p99 / max ms "
        "| probe failures | verdict |"
    )
    print("|---|---|---:|---:|---:|---|")
    for r in results:
        statuses = {label: Counter(counts) for label, counts in r.statuses.items()}
        print(
            f"| {r.name} | {format_outcomes(statuses)} | {r.healthz.cell()} | {r.bystander.cell()} | "
            f"{r.healthz.failures} + {r.bystander.failures} | {r.verdict} |"
        )
    print()
    for r in results:
        print(f"- **{r.name}** ({r.seconds:.0f} s): {r.summary}")
    print()
    for r in results:
        for line in [*r.notes, *(f"FINDING: {p}" for p in r.problems)]:
            print(f"- {r.name}: {line}")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="window per attack (some need more)")
    parser.add_argument(
        "--only", choices=sorted(ATTACKS), action="append", default=None, help="run this attack (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    parser.add_argument(
        "--setting",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="serve with this setting instead of its default, e.g. max_concurrent_requests_per_tenant=6 (repeatable)",
    )
    args = parser.parse_args(argv)
    args.setting = dict(args.setting)
    return args


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or name.lower() not in Settings.model_fields:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME a setting, got {text!r}")
    return name.lower(), value


def _run_all(names: Sequence[str], *, seconds: float, tmp: Path, overrides: Mapping[str, str]) -> list[AttackResult]:
    data_dir = tmp / "data"
    principals = create_principals(data_dir, attacks=[ATTACKS[name] for name in names])
    digits = _digits_csv()
    bomb = build_npz_bomb() if "npz-bomb" in names else b""
    results = []
    with served_api(data_dir=data_dir, log_path=tmp / "serve.log", overrides=overrides) as api:
        dataset_id = upload_digits(api.base, key=principals.admin_key, name="a-digits", csv=digits)
        upload_digits(api.base, key=principals.bystander_key, name="b-digits", csv=digits)
        if any(ATTACKS[name].needs_history for name in names):
            build_history(api.base, key=principals.admin_key, dataset_id=dataset_id)
        for name in names:
            notes = settle(base=api.base, principals=principals)

            def ctx_for(until: float, name: str = name) -> AttackContext:
                return AttackContext(
                    base=api.base,
                    attacker_key=principals.attack_keys[name][0],
                    extra_attacker_keys=principals.attack_keys[name][1:],
                    admin_key=principals.admin_key,
                    dataset_id=dataset_id,
                    bystander_name=TENANTS["bystander"],
                    third_name=TENANTS["third"],
                    data_dir=data_dir,
                    api_pid=api.pid,
                    digits_csv=digits,
                    npz_bomb=bomb,
                    until=until,
                )

            result = run_attack(
                ATTACKS[name],
                ctx_for=ctx_for,
                seconds=seconds,
                base=api.base,
                bystander_key=principals.bystander_key,
                api_pid=api.pid,
                notes=notes,
            )
            print(f"{name}: {result.verdict}", file=sys.stderr, flush=True)
            results.append(result)
    return results


def _to_json(result: AttackResult) -> dict[str, Any]:
    out = dict(result.__dict__)
    out["healthz"], out["bystander"] = result.healthz.__dict__, result.bystander.__dict__
    return out


def _exit_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(128 + signal.SIGTERM)  # so the served API and its worker are cleaned up


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    names = args.only or list(ATTACKS)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="privtrain-attack-") as tmp:
        results = _run_all(names, seconds=args.seconds, tmp=Path(tmp), overrides=args.setting)
    print_report(results, started=started, overrides=args.setting)
    if args.json is not None:
        args.json.write_text(json.dumps([_to_json(r) for r in results], indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
