"""Dashboard pages: budget gauges and ledger numbers equal the API's, live status script under a
nonce CSP, the HTML report through the UI, the cookie-authenticated event stream, escaping, no
external assets, and tenant isolation (404 for another tenant's objects)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from privtrain_common.directed_rounding import format_remaining
from tests.ui.conftest import HOSTILE_NAME, UiWorld, csrf_token_of
from tests.ui.html_probe import parse, text_of


@pytest.fixture(scope="module")
def alice_browser(ui_world: UiWorld) -> TestClient:
    return ui_world.logged_in(ui_world.alice_key)


def _assert_self_contained(html: str) -> None:
    page = parse(html)
    assert not page.tags("link") and not page.tags("iframe")
    for element in page.elements:
        for name in ("src", "href", "xlink:href", "action"):
            value = element.attrs.get(name)
            if value is not None:
                assert value.startswith(("#", "/ui/", "data:")), (element.tag, name, value)
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }


def test_datasets_page_shows_the_budget_the_api_reports(ui_world: UiWorld, alice_browser: TestClient) -> None:
    html = alice_browser.get("/ui/datasets").text
    page = parse(html)
    (row,) = page.with_attr("data-dataset-id", ui_world.dataset_id)
    budget = ui_world.client(ui_world.alice_key).get(f"/v1/datasets/{ui_world.dataset_id}/budget").json()
    for field in ("committed_epsilon", "reserved_epsilon", "remaining_epsilon"):
        (cell,) = [e for e in page.inside(row) if e.attrs.get("data-field") == field]
        assert float(cell.attrs["data-value"]) == budget[field]
    assert budget["committed_epsilon"] > 0 and budget["reserved_epsilon"] > 0, "fixture has both"
    (gauge,) = [e for e in page.inside(row) if e.attrs.get("class") == "gauge"]
    committed, reserved = [
        float(re.search(r"width: ([0-9.]+)%", e.attrs["style"]).group(1))  # type: ignore[union-attr]
        for e in page.inside(gauge)
    ]
    free = 100 - committed - reserved
    assert free == pytest.approx(100 * budget["remaining_epsilon"] / budget["epsilon"], abs=0.02), (
        "the empty part of the bar is what a new job can get"
    )
    assert committed < 100 * budget["committed_epsilon"] / budget["epsilon"] - 5, "not committed ε ÷ budget ε"
    assert reserved > 0
    label = gauge.attrs["aria-label"]
    assert float(gauge.attrs["data-used-percent"]) == pytest.approx(committed + reserved, abs=0.02)
    assert "% of what a new job could have had on a fresh budget" in label
    assert f"remaining {format_remaining(budget['remaining_epsilon'], digits=4)} of ε 9" in label
    assert HOSTILE_NAME not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    _assert_self_contained(html)


def test_dataset_page_lists_the_whole_ledger_with_a_plot(ui_world: UiWorld, alice_browser: TestClient) -> None:
    html = alice_browser.get(f"/ui/datasets/{ui_world.dataset_id}").text
    page = parse(html)
    entries = ui_world.client(ui_world.alice_key).get(f"/v1/datasets/{ui_world.dataset_id}/ledger").json()["items"]
    rows = page.with_attr("data-seq")
    assert sorted(int(r.attrs["data-seq"]) for r in rows) == [e["seq"] for e in entries]
    by_seq = {int(r.attrs["data-seq"]): r for r in rows}
    for entry in entries:
        (hash_cell,) = [e for e in page.inside(by_seq[entry["seq"]]) if "hash" in e.attrs.get("class", "").split()]
        assert hash_cell.attrs["title"] == entry["hash"]
        assert entry["kind"] in text_of(by_seq[entry["seq"]])
        (explained,) = [e for e in page.inside(by_seq[entry["seq"]]) if e.attrs.get("class") == "explanation"]
        assert entry["explanation"] and text_of(explained).strip() == entry["explanation"]  # the API's words
    assert {"ADJUST", "RESERVE", "TOUCH", "COMMIT"} <= {e["kind"] for e in entries}
    assert page.inside(page.by_id("plot-ledger"))[0].tag == "svg"
    assert text_of(page.by_id("dataset-name")) == " ".join(HOSTILE_NAME.split())
    _assert_self_contained(html)


def test_jobs_page_streams_live_status_under_a_nonce_csp(ui_world: UiWorld, alice_browser: TestClient) -> None:
    response = alice_browser.get("/ui/jobs")
    page = parse(response.text)
    statuses = {
        r.attrs["data-job-id"]: text_of(
            next(e for e in page.inside(r) if e.attrs.get("class", "").startswith("status"))
        )
        for r in page.with_attr("data-job-id")
    }
    assert statuses[ui_world.job_id] == "succeeded" and statuses[ui_world.queued_job_id] == "queued"
    (script,) = page.tags("script")
    nonce = script.attrs["nonce"]
    csp = response.headers["content-security-policy"]
    assert f"script-src 'nonce-{nonce}'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert "EventSource" in script.text and ui_world.queued_job_id in script.text
    assert ui_world.job_id not in script.text, "finished jobs get no stream"
    assert alice_browser.get("/ui/jobs").headers["content-security-policy"] != csp, "a fresh nonce per page"
    _assert_self_contained(response.text)


def test_job_page_and_its_report_through_the_ui(
    ui_world: UiWorld, alice_browser: TestClient, report_json: dict
) -> None:
    job = alice_browser.get(f"/ui/jobs/{ui_world.job_id}")
    assert job.status_code == 200 and "succeeded" in job.text
    assert not parse(job.text).tags("script"), "a finished job's page needs no stream"
    report = alice_browser.get(f"/ui/jobs/{ui_world.job_id}/report")
    assert report.status_code == 200
    page = parse(report.text)
    assert float(page.by_id("epsilon-ledger").attrs["data-value"]) == report_json["epsilon"]["ledger"]
    assert any(a.attrs.get("href") == "/ui/jobs" for a in page.tags("a"))
    queued = alice_browser.get(f"/ui/jobs/{ui_world.queued_job_id}")
    assert "EventSource" in queued.text
    assert alice_browser.get(f"/ui/jobs/{ui_world.queued_job_id}/report").status_code == 409


def test_event_stream_accepts_the_session_cookie(ui_world: UiWorld, alice_browser: TestClient) -> None:
    with alice_browser.stream("GET", f"/ui/jobs/{ui_world.job_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        body = "".join(response.iter_text())
    kinds = re.findall(r"^event: (.+)$", body, flags=re.MULTILINE)
    api_kinds = [
        e["kind"] for e in ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{ui_world.job_id}/events").json()
    ]
    assert kinds == api_kinds and kinds[-1] == "succeeded"
    ids = [int(i) for i in re.findall(r"^id: (\d+)$", body, flags=re.MULTILINE)]
    with alice_browser.stream(
        "GET", f"/ui/jobs/{ui_world.job_id}/events", headers={"Last-Event-ID": str(ids[-2])}
    ) as resumed:
        assert re.findall(r"^event: (.+)$", "".join(resumed.iter_text()), flags=re.MULTILINE) == ["succeeded"]


def test_other_tenants_objects_are_404_and_not_listed(ui_world: UiWorld) -> None:
    bob = ui_world.logged_in(ui_world.bob_key)
    assert ui_world.dataset_id not in bob.get("/ui/datasets").text
    assert ui_world.job_id not in bob.get("/ui/jobs").text
    for path in (
        f"/ui/datasets/{ui_world.dataset_id}",
        f"/ui/jobs/{ui_world.job_id}",
        f"/ui/jobs/{ui_world.job_id}/report",
        f"/ui/jobs/{ui_world.job_id}/events",
    ):
        assert bob.get(path).status_code == 404, path
    assert "alice" not in bob.get("/ui/datasets").text
    assert csrf_token_of(bob.get("/ui/jobs").text)


def test_a_deleted_dataset_leaves_the_list_and_its_page_says_it_is_a_tombstone(
    ui_world: UiWorld, alice_browser: TestClient
) -> None:
    dataset_id = ui_world.upload_dataset(ui_world.alice_key, name="to be deleted")
    deleted = ui_world.client(ui_world.alice_key).delete(f"/v1/datasets/{dataset_id}")
    assert deleted.status_code == 200, deleted.text
    assert not parse(alice_browser.get("/ui/datasets").text).with_attr("data-dataset-id", dataset_id)
    page = alice_browser.get(f"/ui/datasets/{dataset_id}")
    assert page.status_code == 200
    (banner,) = parse(page.text).with_attr("id", "dataset-deletion")
    assert "Deleted by its owner" in text_of(banner) and "continues this ledger" in page.text
    assert parse(page.text).with_attr("id", "ledger-entries")  # the ledger stays on the tombstone
