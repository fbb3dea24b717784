"""The report says how this job's noise was drawn, what a raised budget means, and whether the
class list was declared: caveats state what the guarantee does not cover."""

from __future__ import annotations

import pytest

from tests.report_fixtures import small_report


def test_the_report_states_whether_gaussians_were_drawn_in_secure_mode() -> None:
    on, off = small_report(secure_gaussian=True), small_report(secure_gaussian=False)
    assert on["noise"]["gaussian_secure_mode"] is True and off["noise"]["gaussian_secure_mode"] is False
    assert "128 secret bits" in on["noise"]["stream"] and "exactly" in on["noise"]["laplace_and_selections"]
    assert any("was drawn in secure mode" in c for c in on["caveats"])
    assert any("NOT drawn in secure mode" in c for c in off["caveats"])
    assert not any("NOT drawn in secure mode" in c for c in on["caveats"])


def test_a_raised_budget_is_reported_as_a_running_total_first() -> None:
    report = small_report(adjustments=[{"seq": 4, "epsilon_from": 2.0, "epsilon_to": 4.0}])
    first = report["caveats"][0]
    assert "ADJUST entries 4" in first and "running total" in first and "fixed in advance" in first
    assert "before the first raise are covered by the budget in force then" in first
    assert not any("running total" in c for c in small_report()["caveats"])


def test_an_observed_class_list_is_a_caveat_and_a_declared_one_is_not() -> None:
    observed = small_report(classes_declared=False)
    declared = small_report(classes_declared=True)
    assert any("No class list was declared" in c for c in observed["caveats"])
    assert not any("No class list was declared" in c for c in declared["caveats"])
    assert observed["dataset"]["classes"] == ["0", "1"] and observed["dataset"]["classes_source"] == "observed"


def test_report_has_a_numeric_prv_bound_for_an_ordinary_dp_sgd_job() -> None:
    from tests.report_fixtures import small_report

    epsilon = small_report()["epsilon"]
    assert epsilon["single_job_method"] == "prv"
    assert epsilon["prv_upper_bound"] <= epsilon["ledger"]


def test_report_falls_back_with_a_reason_when_the_numeric_accountant_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernel.privacy import single_job
    from tests.report_fixtures import small_report

    monkeypatch.setattr(single_job, "NUMERIC_TIMEOUT_S", 1e-6)
    epsilon = small_report()["epsilon"]
    assert epsilon["single_job_method"] in {"rdp-single-job", "rdp"}
    assert "numeric accountant not available" in epsilon["prv_label"]
