"""No first-party module over 700 lines: a module that large holds more than one job. The worker's
modules stay under 400: its runner is a thin facade over parts with one job each."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 700
FOLDERS = (
    "kernel",
    "api",
    "admin",
    "algorithms",
    "dp",
    "training",
    "worker",
    "client/privtrain",
    "common/privtrain_common",
)

WORKER_MAX_LINES = 400

SPLIT_ELSEWHERE: frozenset[str] = frozenset()
"""Modules over the limit today, left to the branch of the redesign that owns each. Each must
still be over it (checked below), so that merging its split fails this test until its entry goes."""


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for folder in FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
    }


def test_no_module_is_over_the_limit() -> None:
    sizes = _sizes()
    assert len(sizes) > 300
    assert {path: n for path, n in sizes.items() if n > MAX_LINES and path not in SPLIT_ELSEWHERE} == {}


def test_no_worker_module_is_over_its_limit() -> None:
    sizes = _sizes()
    worker = {path: n for path, n in sizes.items() if path.startswith("worker/")}
    assert len(worker) > 10
    assert {path: n for path, n in worker.items() if n > WORKER_MAX_LINES} == {}


def test_each_module_split_elsewhere_is_still_over_the_limit() -> None:
    sizes = _sizes()
    assert {path: sizes.get(path) for path in SPLIT_ELSEWHERE if sizes.get(path, 0) <= MAX_LINES} == {}
