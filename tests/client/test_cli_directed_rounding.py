"""The CLI's tables print guarantees rounded up and remaining budgets rounded down (never to
nearest: ε = 3.00012 printed as ``3`` would overstate the privacy); ``--json`` stays exact.
The server is a canned ``httpx.MockTransport`` so the figures are chosen, not computed."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from click.testing import CliRunner, Result

from privtrain.cli import CliEnvironment, cli

JOB = {
    "id": "job_1",
    "dataset_id": "ds_1",
    "status": "succeeded",
    "algorithm": "dp-sgd",
    "model": "logistic-regression",
    "noise_multiplier": 1.1,
    "steps_planned": 4,
    "steps_run": 4,
    "delta": 1e-05,
    "epsilon_ledger": 3.00012,
    "epsilon_prv": 2.50004,
    "attempt": 1,
    "cancel_requested": False,
    "error_code": None,
    "metrics": None,
    "spec": {},
    "created_at": "2024-01-01T00:00:00+00:00",
    "started_at": None,
    "finished_at": None,
}
BUDGET = {
    "dataset_id": "ds_1",
    "epsilon": 8.0,
    "delta": 1e-05,
    "committed_epsilon": 3.00012,
    "reserved_epsilon": 1.20004,
    "spent_epsilon": 4.20016,
    "remaining_epsilon": 1.83186,
    "entries": 3,
    "last_hash": "ab" * 32,
}
ESTIMATE = {
    "noise_multiplier": 1.1,
    "sampling_probability": 0.01,
    "steps": 100,
    "delta": 1e-05,
    "epsilon_ledger": 3.00012,
    "epsilon_prv": 2.50004,
    "noise_std_on_sum": 1.1,
    "sensitivity": 1.0,
    "admissible": True,
    "budget_remaining_epsilon": 1.83186,
    "largest_admissible_epsilon": 1.83186,
    "evaluation_epsilon": None,
}
ROUTES: dict[tuple[str, str], Any] = {
    ("GET", "/v1/jobs/job_1"): JOB,
    ("GET", "/v1/jobs"): {"items": [JOB], "next_cursor": None},
    ("GET", "/v1/datasets/ds_1/budget"): BUDGET,
    ("POST", "/v1/jobs/estimate"): ESTIMATE,
}


def _serve(request: httpx.Request) -> httpx.Response:
    body = ROUTES.get((request.method, request.url.path))
    return httpx.Response(200, json=body) if body is not None else httpx.Response(404, json={"title": "Not Found"})


def _run(*args: str) -> Result:
    result = CliRunner().invoke(
        cli,
        ["--url", "http://privtrain.test", "--api-key", "pt_test", *args],
        obj=CliEnvironment(transport=httpx.MockTransport(_serve)),
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def _block(result: Result) -> dict[str, str]:
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines())


def _epsilon_label(block: dict[str, str], prefix: str = "ε (ledger) at δ=") -> str:
    (label,) = [k for k in block if k.startswith(prefix)]
    assert float(label.removeprefix(prefix)) >= JOB["delta"], label
    return label


def test_job_show_and_list_round_the_guarantee_up() -> None:
    shown = _block(_run("jobs", "show", "job_1"))
    assert shown[_epsilon_label(shown)] == "3.001"  # nearest gave "3"
    assert float(shown["ε (single job, tightest)"]) >= JOB["epsilon_prv"]
    table = _run("jobs", "list").stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert row[header.index("ε")] == "3.001"


def test_budget_rounds_spent_up_and_remaining_down() -> None:
    shown = _block(_run("datasets", "budget", "ds_1"))
    for key, field in (
        ("committed ε", "committed_epsilon"),
        ("reserved ε", "reserved_epsilon"),
        ("spent ε", "spent_epsilon"),
        ("budget ε_G", "epsilon"),
        ("budget δ_G", "delta"),
    ):
        assert float(shown[key]) >= BUDGET[field], key
    assert shown["committed ε"] == "3.001" and shown["spent ε"] == "4.201"
    assert shown["remaining ε"] == "1.831"  # nearest gave "1.832", more than is left
    assert shown["budget ε_G"] == "8"


def test_estimate_rounds_the_cost_up_and_what_fits_down() -> None:
    shown = _block(_run("jobs", "estimate", "--dataset", "ds_1", "--model", "m", "--algorithm", "a"))
    assert shown[_epsilon_label(shown, "ε reserved at δ=")] == "3.001"
    assert shown["budget remaining ε"] == shown["largest admissible target ε"] == "1.831"


def test_json_output_stays_exact() -> None:
    assert json.loads(_run("jobs", "show", "job_1", "--json").stdout)["epsilon_ledger"] == 3.00012
    assert json.loads(_run("datasets", "budget", "ds_1", "--json").stdout)["remaining_epsilon"] == 1.83186
