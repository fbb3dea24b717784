"""Only kernel.jobs.lifecycle moves a job: no other module writes a job's status, its events or its
ledger entries (reserve, touch, commit, release); and domain errors answer as the problems the
API documents."""

from __future__ import annotations

import ast
from pathlib import Path

from api.problems import Problem
from api.routes.domain_errors import problem_for
from kernel.errors import Conflict, InvalidInput, LimitReached, NotFound
from kernel.jobs.lifecycle import ActiveJobLimitReached, JobNotCancellable

REPO = Path(__file__).resolve().parents[2]
LEDGER_WRITES = {"reserve", "touch", "commit", "release"}
SERVER_PACKAGES = ("kernel", "api", "admin", "algorithms", "dp", "training", "worker")


def _server_modules() -> list[Path]:
    return sorted(path for package in SERVER_PACKAGES for path in (REPO / package).rglob("*.py"))


def _lifecycle_writes(tree: ast.AST) -> list[str]:
    """Status assignments (``x.status = …``, ``.values(status=…)``) and calls of the writers."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found += [
                f"line {node.lineno}: .status ="
                for target in node.targets
                if isinstance(target, ast.Attribute) and target.attr == "status"
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            on_ledger = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "ledger"
            if name == "add_job_event" or (on_ledger and name in LEDGER_WRITES):
                found.append(f"line {node.lineno}: {name}()")
            if name == "values" and any(keyword.arg == "status" for keyword in node.keywords):
                found.append(f"line {node.lineno}: values(status=…)")
    return found


def test_only_the_lifecycle_writes_job_transitions() -> None:
    allowed = {
        REPO / "kernel" / "jobs" / "lifecycle.py",
        REPO / "kernel" / "jobs" / "events.py",
        REPO / "kernel" / "ledger" / "operations.py",
        REPO / "api" / "problems.py",  # Problem.status is an HTTP status
        REPO / "kernel" / "datasets" / "status.py",  # a dataset's status (deletion), the one module that writes it
    }
    offenders = {
        str(path.relative_to(REPO)): writes
        for path in _server_modules()
        if path not in allowed and (writes := _lifecycle_writes(ast.parse(path.read_text())))
    }
    assert offenders == {}


def test_the_scan_sees_status_writes() -> None:
    """The check above would pass vacuously if the scan missed the forms it looks for."""
    tree = ast.parse("job.status = 'x'\ntx.execute(update(Job).values(status='y'))\nledger.commit(tx)\n")
    assert len(_lifecycle_writes(tree)) == 3


def test_a_domain_error_answers_as_the_problem_with_the_same_members() -> None:
    limit = ActiveJobLimitReached(active=3, limit=3)
    problem = problem_for(limit)
    expected = Problem(
        status=429,
        slug="too-many-active-jobs",
        detail=limit.detail,
        extra={"active_jobs": 3, "limit": 3},
        headers={"Retry-After": "30"},
    )
    assert (problem.body("/v1/jobs"), problem.headers) == (expected.body("/v1/jobs"), expected.headers)


def test_each_kind_of_domain_error_has_its_status() -> None:
    statuses = {
        kind.__name__: problem_for(kind(slug="s", detail="d")).status
        for kind in (InvalidInput, NotFound, Conflict, LimitReached)
    }
    assert statuses == {"InvalidInput": 422, "NotFound": 404, "Conflict": 409, "LimitReached": 429}
    assert problem_for(JobNotCancellable("succeeded")).status == 409  # a subclass takes its base's


SETTLING = {"claim", "stop_early", "fail", "cancel", "requeue_or_fail"}
"""The transitions that may commit a charge without success: each must be given a report writer."""


def test_every_transition_that_may_commit_is_given_a_report_writer() -> None:
    """Every ε spent has a report: a service path that settled a job without a writer would leave a
    job that committed ε without one (the lifecycle only logs that, for tests that need no report)."""
    missing = []
    for path in _server_modules():
        if path == REPO / "kernel" / "jobs" / "lifecycle.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            on_lifecycle = getattr(node.func.value, "id", "") == "lifecycle"
            if on_lifecycle and node.func.attr in SETTLING and "write_report" not in {k.arg for k in node.keywords}:
                missing.append(f"{path.relative_to(REPO)}:{node.lineno} lifecycle.{node.func.attr}()")
    assert missing == []
    # and the scan does see such calls
    seen = ast.parse("lifecycle.cancel(db, job_id=j)\nlifecycle.fail(db, write_report=w)\n")
    assert (
        sum(isinstance(n, ast.Call) and "write_report" not in {k.arg for k in n.keywords} for n in ast.walk(seen)) == 1
    )
