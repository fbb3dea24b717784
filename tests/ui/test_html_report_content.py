"""GET /v1/jobs/{id}/report?format=html: the numbers are the JSON report's, the plots are there,
the page is self-contained and escaped, and it is scoped to the tenant like the JSON."""

from __future__ import annotations

import json
import re

from kernel import privacy
from kernel.reporting.step_series import sampled_steps
from tests.ui.conftest import HOSTILE_NAME, UiWorld
from tests.ui.html_probe import Page, parse, text_of


def _value(page: Page, element_id: str) -> str:
    return page.by_id(element_id).attrs["data-value"]


def test_json_stays_the_default_and_format_json_is_the_same(ui_world: UiWorld, report_json: dict) -> None:
    client = ui_world.client(ui_world.alice_key)
    explicit = client.get(f"/v1/jobs/{ui_world.job_id}/report", params={"format": "json"})
    assert explicit.headers["content-type"].startswith("application/json")
    assert explicit.json() == report_json
    assert client.get(f"/v1/jobs/{ui_world.job_id}/report", params={"format": "pdf"}).status_code == 422


def test_headline_numbers_are_the_json_reports(report_html: str, report_json: dict) -> None:
    page = parse(report_html)
    epsilon = report_json["epsilon"]
    assert float(_value(page, "epsilon-ledger")) == epsilon["ledger"]
    assert float(_value(page, "epsilon-single-job")) == epsilon["single_job"] == epsilon["prv_upper_bound"]
    assert float(_value(page, "epsilon-rdp")) == epsilon["rdp_at_delta"]
    assert float(_value(page, "delta")) == epsilon["delta"]
    assert int(_value(page, "steps-run")) == report_json["mechanism"]["steps_run"]
    assert int(_value(page, "steps-planned")) == report_json["mechanism"]["steps_planned"]
    assert text_of(page.by_id("guarantee")) == report_json["guarantee"]
    assert text_of(page.by_id("commit-hash")) == report_json["ledger"]["commit_entry_hash"]
    assert text_of(page.by_id("commit-seq")) == f"#{report_json['ledger']['commit_entry_seq']}"
    assert "✓" in text_of(page.by_id("commit-verified"))
    assert text_of(page.by_id("dataset-sha256")) == report_json["dataset"]["sha256"]
    assert text_of(page.by_id("model-sha256")) == report_json["model"]["sha256"]
    assert text_of(page.by_id("job-id")) == report_json["job_id"]


def test_every_mechanism_parameter_and_hyperparameter_is_shown(report_html: str, report_json: dict) -> None:
    page = parse(report_html)
    for section, values in (
        ("mechanism", report_json["mechanism"]),
        ("hyperparameters", report_json["algorithm"]["hyperparameters"]),
        ("training", report_json["algorithm"]["training"]),
    ):
        for key, value in values.items():
            (cell,) = page.with_attr("data-field", f"{section}.{key}")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert [float(v) for v in page.values_in(cell)] == [value], (section, key)
            elif value is None:
                assert text_of(cell) == "—", (section, key)
            else:
                assert text_of(cell) == str(value), (section, key)


def test_budget_before_and_after_are_the_json_reports(report_html: str, report_json: dict) -> None:
    page = parse(report_html)
    for when in ("before", "after"):
        for key in (
            "epsilon",
            "delta",
            "committed_epsilon",
            "reserved_epsilon",
            "spent_epsilon",
            "remaining_epsilon",
            "entries",
        ):
            (cell,) = page.with_attr("data-field", f"{when}.{key}")
            assert float(cell.attrs["data-value"]) == report_json["ledger"][when][key], (when, key)


def test_rdp_curve_metrics_caveats_and_event_are_all_there(report_html: str, report_json: dict) -> None:
    page = parse(report_html)
    assert [float(v) for v in page.values_in(page.by_id("rdp-curve"))] == report_json["rdp_curve"]["values"]
    caveats = [text_of(li) for li in page.inside(page.by_id("caveats")) if li.tag == "li"]
    assert caveats == [" ".join(c.split()) for c in report_json["caveats"]]
    metrics = report_json["released_metrics"]
    assert metrics, "the fixture job releases a DP metric"
    shown_metrics = [float(v) for v in page.values_in(page.by_id("released-metrics"))]
    # the metric, then its interval, then its noise scale: each beside the others, from the JSON
    assert shown_metrics == [
        metrics["accuracy"],
        metrics["interval"]["low"],
        metrics["interval"]["high"],
        metrics["noise_scale"],
    ]
    assert json.loads(page.by_id("released-metrics-json").text) == metrics
    assert "public quantities only" in text_of(page.by_id("released-metrics-note"))
    shown_event = json.loads(page.by_id("event-json").text)
    assert shown_event == report_json["event"]
    assert report_json["ledger"]["budget_adjustments"], "the fixture raised the budget"
    rows = [e for e in page.inside(page.by_id("adjustments")) if e.tag == "tr"]
    assert len(rows) == 1 + len(report_json["ledger"]["budget_adjustments"])


def test_epsilon_by_steps_is_recomputed_with_the_accountant(report_html: str, report_json: dict) -> None:
    """Each tabulated ε equals the ledger ε of k Poisson-subsampled Gaussian steps at the job's
    (q, σ) — the dp-sgd event — and the curve stops at the steps run, below the charged ε, which
    also includes the released metric's Laplace mechanism."""
    page = parse(report_html)
    cells = [e for e in page.inside(page.by_id("epsilon-steps")) if e.tag == "td"]
    ks = [int(text_of(e)) for e in cells[0::2]]
    epsilons = [float(e.attrs["data-value"]) for e in cells[1::2]]
    mechanism, delta = report_json["mechanism"], report_json["epsilon"]["delta"]
    assert ks[0] == 1 and ks[-1] == mechanism["steps_run"] and set(ks) <= set(sampled_steps(mechanism["steps_run"]))
    for k, epsilon in zip(ks, epsilons, strict=True):
        event = privacy.PoissonSampledGaussianEvent(
            sampling_probability=mechanism["sampling_probability"],
            noise_multiplier=mechanism["noise_multiplier"],
            count=k,
        )
        assert epsilon == privacy.ledger_epsilon(privacy.rdp_curve(event), delta)
    assert epsilons == sorted(epsilons)
    assert epsilons[-1] < report_json["epsilon"]["ledger"]


def test_sampled_steps_cover_one_to_t() -> None:
    assert sampled_steps(5) == (1, 2, 3, 4, 5)
    many = sampled_steps(10_000, max_points=60)
    assert many[0] == 1 and many[-1] == 10_000 and len(many) <= 60 and list(many) == sorted(set(many))


def test_three_inline_svg_plots_with_unique_ids(report_html: str) -> None:
    page = parse(report_html)
    for figure_id in ("plot-epsilon-steps", "plot-rdp", "plot-ledger"):
        inside = page.inside(page.by_id(figure_id))
        assert inside[0].tag == "svg", figure_id
        assert len([e for e in inside if e.tag == "path"]) > 10, figure_id
    ids = page.ids()
    assert len(ids) == len(set(ids)), "duplicate element ids across the inline SVGs"


def test_page_is_self_contained(report_html: str) -> None:
    page = parse(report_html)
    assert not page.tags("script") and not page.tags("link") and not page.tags("iframe")
    for element in page.elements:
        for name in ("src", "href", "xlink:href", "action", "srcset", "poster"):
            if name in element.attrs:
                value = element.attrs[name]
                assert value.startswith(("#", "data:")), (element.tag, name, value)
    assert not re.search(r"url\(\s*['\"]?(?!#)", report_html), "CSS/SVG url() to something outside"
    assert "@import" not in report_html
    outside = set(re.findall(r"https?://[^\s\"'<>)]+", report_html))
    assert outside <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, outside


def test_hostile_names_are_escaped(report_html: str) -> None:
    page = parse(report_html)
    assert text_of(page.by_id("dataset-name")) == " ".join(HOSTILE_NAME.split())
    assert HOSTILE_NAME not in report_html
    assert "<img" not in report_html and "onerror=alert" not in report_html.replace("onerror=alert(1)&gt;", "")
    assert not [e for e in page.elements if "onerror" in e.attrs]
    assert "owner raised &lt;it&gt;" in report_html


def test_response_headers_forbid_scripts_and_name_the_file(ui_world: UiWorld) -> None:
    response = ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{ui_world.job_id}/report", params={"format": "html"})
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp
    assert response.headers["content-disposition"] == f'inline; filename="{ui_world.job_id}-privacy-report.html"'
    assert response.headers["x-content-type-options"] == "nosniff"


def test_other_tenants_get_404_and_anonymous_401(ui_world: UiWorld) -> None:
    path = f"/v1/jobs/{ui_world.job_id}/report"
    bob = ui_world.client(ui_world.bob_key).get(path, params={"format": "html"})
    assert bob.status_code == 404 and bob.json()["type"] == "/problems/not-found"
    assert ui_world.client().get(path, params={"format": "html"}).status_code == 401


def test_unfinished_job_has_no_html_report(ui_world: UiWorld) -> None:
    response = ui_world.client(ui_world.alice_key).get(
        f"/v1/jobs/{ui_world.queued_job_id}/report", params={"format": "html"}
    )
    assert response.status_code == 409 and response.json()["type"] == "/problems/job-not-succeeded"


def test_released_weights_and_where_it_trained_are_stated(report_html: str, report_json: dict) -> None:
    page = parse(report_html)
    released = report_json["released_weights"]["statement"]
    assert text_of(page.by_id("released-weights")) == released[:1].upper() + released[1:] + "."
    execution = report_json["execution"]
    assert execution["device"] == "cpu" and execution["examples_per_second"] > 0
    assert text_of(page.by_id("execution")).startswith("Trained on cpu in fp32")
