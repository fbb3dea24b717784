"""Units behind the HTML report: the ledger replay, the ε-by-steps guard, the plots' hygiene
(no pyplot, no torch in the API process), and the session cookie codec."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from api.routes.ui_session import LoginFormCookie, SessionCookie, decode_cookie, encode_cookie
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget
from kernel.ledger import operations as ledger
from kernel.reporting import SeriesUnavailable, epsilon_by_steps, ledger_history, opening_budget
from kernel.reporting.job_report import report_html_for_job
from tests.ui.conftest import UiWorld
from tests.ui.html_probe import parse, text_of

ROOT = Path(__file__).resolve().parents[2]


def test_ledger_replay_ends_at_the_budget_rows_totals(ui_world: UiWorld) -> None:
    """Replaying every entry gives exactly what the cached budget row says (docs/privacy-model.md#ledger)."""
    with ui_world.db.read_session() as session:
        budget = session.get(PrivacyBudget, ui_world.dataset_id)
        assert budget is not None
        entries = list(session.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == budget.dataset_id)))
        opening = opening_budget(session, budget)
        summary = ledger.budget_summary(budget)
    assert opening == (8.0, 1e-5), "the fixture registered ε = 8 and raised it to 9"
    history = ledger_history(reversed(entries), opening_epsilon=opening[0], opening_delta=opening[1])
    assert [p.seq for p in history] == sorted(e.seq for e in entries)
    assert [p.budget_epsilon for p in history if p.kind == "ADJUST"] == [9.0]
    last = history[-1]
    assert last.committed_epsilon == summary["committed_epsilon"]
    assert last.total_epsilon == summary["spent_epsilon"]
    assert last.hash == summary["last_hash"]
    assert history[0].budget_epsilon == 9.0 and history[0].kind == "ADJUST"
    reserve = next(p for p in history if p.kind == "RESERVE")
    assert reserve.committed_epsilon == 0 and reserve.entry_epsilon > 0
    # add_curves rounds outwards, so a sum with zero may sit an ulp above: never below
    assert reserve.entry_epsilon <= reserve.total_epsilon == pytest.approx(reserve.entry_epsilon, rel=1e-9)
    commit = next(p for p in history if p.kind == "COMMIT")
    assert commit.entry_epsilon <= commit.committed_epsilon == pytest.approx(commit.entry_epsilon, rel=1e-9)


def test_no_curve_is_drawn_when_the_event_cannot_be_rebuilt(ui_world: UiWorld, report_json: dict) -> None:
    tampered = copy.deepcopy(report_json)
    tampered["event"]["event"]["events"][0]["noise_multiplier"] *= 1.5
    with ui_world.db.read_session() as session:
        job = session.get(Job, ui_world.job_id)
        dataset = session.get(Dataset, ui_world.dataset_id)
        assert job is not None and dataset is not None
        assert epsilon_by_steps(job, dataset, report_json).steps[-1] == report_json["mechanism"]["steps_run"]
        with pytest.raises(SeriesUnavailable, match="differs"):
            epsilon_by_steps(job, dataset, tampered)
        tampered["ledger"]["commit_entry_hash"] = "0" * 64
        page = parse(report_html_for_job(session, job, tampered, viewer_tenant_id=dataset.tenant_id))
    assert "differs from the event in the report" in text_of(page.by_id("epsilon-steps-unavailable"))
    assert "✗" in text_of(page.by_id("commit-verified")), "a hash the ledger does not hold is flagged"
    assert len(page.tags("svg")) == 2


def test_rendering_imports_neither_torch_nor_pyplot(ui_world: UiWorld, report_json: dict, tmp_path: Path) -> None:
    """The API process stays torch-free and pyplot-free while it renders a report and a page."""
    report_path = tmp_path / "report.json"
    report_path.write_text(json.dumps(report_json))
    script = textwrap.dedent(f"""
        import json, sys
        import api.main
        from kernel.db.engine import Database
        from kernel.db.orm import Job
        from kernel.reporting.job_report import report_html_for_job
        from api.routes import ui
        db = Database({ui_world.settings.resolved_database_url!r})
        with db.read_session() as session:
            job = session.get(Job, {ui_world.job_id!r})
            html = report_html_for_job(session, job, json.load(open({str(report_path)!r})),
                                       viewer_tenant_id=job.tenant_id)
        assert html.count("<svg") == 3
        import matplotlib
        assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
        print(sorted(m for m in ("torch", "matplotlib.pyplot") if m in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_cookie_codec_round_trips_and_rejects_tampering() -> None:
    for cookie in (
        SessionCookie(token="tok", key_digest="a" * 64, issued_at=1000.0),
        LoginFormCookie(csrf_token="t", issued_at=1000.0),
    ):
        value = encode_cookie(cookie, b"k" * 32)
        assert decode_cookie(value, b"k" * 32, max_age_s=100, now=1050.0) == cookie
        assert decode_cookie(value, b"k" * 32, max_age_s=100, now=1100.0) is None  # too old
        assert decode_cookie(value, b"k" * 32, max_age_s=100, now=900.0) is None  # from the future
        assert decode_cookie(value, b"x" * 32, max_age_s=100, now=1050.0) is None  # other secret
    value = encode_cookie(SessionCookie(token="tok", key_digest="a" * 64, issued_at=1000.0), b"k" * 32)
    signature = value.split(".")[1]
    forged_payload = encode_cookie(SessionCookie(token="tok", key_digest="b" * 64, issued_at=1000.0), b"k" * 32).split(
        "."
    )[0]
    assert decode_cookie(f"{forged_payload}.{signature}", b"k" * 32, max_age_s=100, now=1050.0) is None


@given(total=st.integers(min_value=1, max_value=10**7), points=st.integers(min_value=2, max_value=200))
def test_sampled_steps_are_sorted_unique_and_span_one_to_t(total: int, points: int) -> None:
    from kernel.reporting.step_series import sampled_steps

    ks = sampled_steps(total, max_points=points)
    assert ks[0] == 1 and ks[-1] == total
    assert list(ks) == sorted(set(ks)) and len(ks) <= max(points, 1)
    if total <= points:
        assert ks == tuple(range(1, total + 1))


def test_production_needs_a_long_ui_session_secret(tmp_path: Path) -> None:
    from kernel.config import UnsafeSettingsError
    from tests.conftest import make_settings

    production = {
        "environment": "production",
        "database_url": "postgresql+psycopg://u:p@db/x",
        "broker_url": "redis://redis:6379/0",
    }
    with pytest.raises(UnsafeSettingsError, match="PRIVTRAIN_UI_SESSION_SECRET"):
        make_settings(tmp_path, ui_session_secret=None, **production).check_safe()
    make_settings(tmp_path, ui_session_secret="s" * 32, **production).check_safe()
    with pytest.raises(ValueError, match="at least 32"):
        make_settings(tmp_path, ui_session_secret="short")
