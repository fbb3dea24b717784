"""The attack run's pure helpers: the verdict and the figures it is built from (no service started)."""

from __future__ import annotations

import argparse
from collections import Counter

import httpx
import pytest

from bench.attack_run import (
    ATTACKS,
    LatencySummary,
    Sample,
    _parse_args,
    _setting,
    csv_variant,
    excess_requests,
    format_outcomes,
    retry_after_s,
    verdict,
)

ISSUE_13_ATTACKS = {
    "tiny-sigma",
    "prv-heavy",
    "sse-flood",
    "upload-lock",
    "big-model",
    "npz-bomb",
    "cookie-rate",
    "grant-enum",
    "tiny-delta",
    "slow-upload",
    "crafted-cursor",
}


ISSUE_36_ATTACKS = {"get-flood", "get-flood-keys", "bad-key-flood"}


def test_every_attack_of_issues_13_and_36_is_registered() -> None:
    assert set(ATTACKS) >= ISSUE_13_ATTACKS | ISSUE_36_ATTACKS
    assert ATTACKS["get-flood-keys"].keys > 1  # spread over several keys of one tenant
    assert ATTACKS["get-flood"].needs_history and ATTACKS["get-flood-keys"].needs_history


def test_the_floods_wait_out_a_429s_retry_after() -> None:
    request = httpx.Request("GET", "http://x/")
    assert retry_after_s(httpx.Response(429, headers={"Retry-After": "3"}, request=request)) == 3.0
    assert retry_after_s(httpx.Response(429, request=request)) == 1.0
    assert retry_after_s(httpx.Response(200, headers={"Retry-After": "3"}, request=request)) == 0.0
    assert retry_after_s(None) == 0.0


def test_settings_may_be_overridden_by_name_only() -> None:
    args = _parse_args(["--only", "idle", "--only", "get-flood", "--setting", "MAX_CONCURRENT_REQUESTS_PER_KEY=4"])
    assert args.only == ["idle", "get-flood"]
    assert args.setting == {"max_concurrent_requests_per_key": "4"}
    with pytest.raises(SystemExit):
        _parse_args(["--setting", "no_such_setting=1"])
    with pytest.raises(argparse.ArgumentTypeError):
        _setting("max_concurrent_requests")  # no value


def test_fast_refusals_hold() -> None:
    outcomes = Counter({"422 validation-error": 30, "429 rate-limited": 200})
    assert verdict(healthz_p99_ms=40, bystander_p99_ms=80, outcomes=outcomes, problems=[]) == "held"


def test_slow_bystander_server_error_hang_and_finding_each_break_the_verdict() -> None:
    outcomes = Counter({"500 internal-error": 2, "timeout": 3, "error ReadError": 1, "200": 5})
    result = verdict(healthz_p99_ms=999, bystander_p99_ms=1000, outcomes=outcomes, problems=["budget moved"])
    assert result == "NOT held: bystander p99 ≥ 1 s, 2× 5xx, 4× hang, 1 finding"


def test_missing_probe_figures_do_not_hold() -> None:
    assert verdict(healthz_p99_ms=float("nan"), bystander_p99_ms=10, outcomes=Counter(), problems=[]).startswith(
        "NOT held: healthz p99"
    )


def test_latency_summary_counts_timeouts_as_failures() -> None:
    samples = [Sample(0.0, 0.010, True), Sample(0.05, 0.020, True), Sample(0.1, 10.0, False)]
    summary = LatencySummary.of(samples)
    assert (summary.count, summary.failures, summary.max_ms) == (3, 1, 10_000.0)
    assert summary.p50_ms == 20.0


def test_format_outcomes_keeps_labels_and_sorts_outcomes() -> None:
    statuses = {"upload": Counter({"429 too-many-uploads": 4, "201": 2}), "submit": Counter({"202": 1})}
    assert format_outcomes(statuses) == "upload: 201×2, 429 too-many-uploads×4; submit: 202×1"
    assert format_outcomes({}) == "—"


def test_excess_requests_subtracts_burst_and_refill() -> None:
    assert excess_requests(requests=400, elapsed_s=0.0) == 200.0  # default burst 200
    assert excess_requests(requests=400, elapsed_s=5.0) == 100.0  # 1200/min refills 100 in 5 s
    assert excess_requests(requests=100, elapsed_s=1.0) == 0.0


def test_csv_variant_changes_the_bytes_not_the_rows() -> None:
    csv = b"x0,x1,label\n0.5,0.25,1\n"
    variant = csv_variant(csv, "7")
    assert variant != csv
    assert variant.splitlines()[1:] == csv.splitlines()[1:]
