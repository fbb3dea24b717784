"""What a dashboard user does besides reading, over HTTP: the CSRF/origin rules of its forms,
cancelling a job (the API's rule, behind a CSRF-protected form), answering invitations, and
the job page's readable event list. The same things in a real browser: test_ui_browser.py."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from kernel.db.orm import Job, utcnow
from tests.ui.conftest import UiWorld, csrf_token_of
from tests.ui.html_probe import parse, text_of


@pytest.fixture(scope="module")
def alice_dataset(ui_world: UiWorld) -> str:
    """Alice's own dataset for these tests, so that the shared world's jobs and ledger stay as
    the other modules expect them."""
    return ui_world.upload_dataset(ui_world.alice_key, name="actions")


def _budget(ui_world: UiWorld, dataset_id: str) -> dict:
    return ui_world.client(ui_world.alice_key).get(f"/v1/datasets/{dataset_id}/budget").json()


def _job(ui_world: UiWorld, job_id: str) -> dict:
    return ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{job_id}").json()


def _post_form(client: TestClient, path: str, token: str | None, **headers: str) -> int:
    data = {"csrf_token": token} if token is not None else {}
    return client.post(path, data=data, headers=headers).status_code


# ------------------------------------------------------------------------- CSRF and origins


def test_dashboard_pages_send_a_same_origin_referrer_policy(ui_world: UiWorld) -> None:
    """Under no-referrer Chromium posted the login form with "Origin: null" and login failed."""
    anonymous = ui_world.client()
    assert anonymous.get("/ui/login").headers["referrer-policy"] == "same-origin"
    browser = ui_world.logged_in(ui_world.alice_key)
    for path in ("/ui/datasets", "/ui/jobs", f"/ui/jobs/{ui_world.job_id}"):
        assert browser.get(path).headers["referrer-policy"] == "same-origin", path


@pytest.mark.parametrize(
    ("headers", "accepted"),
    [
        ({}, True),  # scripts and old browsers: the token alone
        ({"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}, True),  # Chromium now
        ({"Origin": "null", "Sec-Fetch-Site": "same-origin"}, True),  # Chromium on a no-referrer page
        ({"Origin": "null"}, False),  # withheld origin, nothing vouches for it
        ({"Origin": "null", "Sec-Fetch-Site": "cross-site"}, False),  # a sandboxed frame elsewhere
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Origin": "http://testserver", "Sec-Fetch-Site": "same-site"}, False),  # a sibling subdomain
        ({"Origin": "https://evil.example"}, False),
    ],
    ids=[
        "no-headers",
        "same-origin",
        "null-vouched",
        "null-alone",
        "null-cross-site",
        "cross-site",
        "same-site",
        "foreign-origin",
    ],
)
def test_login_origin_rules(ui_world: UiWorld, headers: dict[str, str], accepted: bool) -> None:
    client = ui_world.client()
    token = csrf_token_of(client.get("/ui/login").text)
    response = client.post("/ui/login", data={"csrf_token": token, "api_key": ui_world.alice_key}, headers=headers)
    assert response.status_code == (303 if accepted else 403), response.text[:300]


def test_a_vouched_null_origin_still_needs_the_token(ui_world: UiWorld) -> None:
    client = ui_world.client()
    client.get("/ui/login")
    response = client.post(
        "/ui/login",
        data={"csrf_token": "guessed", "api_key": ui_world.alice_key},
        headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"},
    )
    assert response.status_code == 403


# ------------------------------------------------------------------------- cancel


def test_cancelling_a_queued_job_from_its_page_gives_its_reservation_back(
    ui_world: UiWorld,
    alice_dataset: str,
) -> None:
    before = _budget(ui_world, alice_dataset)
    job_id = ui_world.submit_job(ui_world.alice_key, dataset_id=alice_dataset)
    assert _budget(ui_world, alice_dataset)["reserved_epsilon"] > before["reserved_epsilon"]
    browser = ui_world.logged_in(ui_world.alice_key)
    page = parse(browser.get(f"/ui/jobs/{job_id}").text)
    cancel_forms = [
        e for e in page.elements if e.tag == "form" and e.attrs.get("action") == f"/ui/jobs/{job_id}/cancel"
    ]
    assert len(cancel_forms) == 1, "the job page offers exactly one cancel form"
    token = csrf_token_of(browser.get(f"/ui/jobs/{job_id}").text)

    assert _post_form(browser, f"/ui/jobs/{job_id}/cancel", None) == 403
    assert _post_form(browser, f"/ui/jobs/{job_id}/cancel", "x" + token) == 403
    assert _post_form(browser, f"/ui/jobs/{job_id}/cancel", token, Origin="https://evil.example") == 403
    assert _job(ui_world, job_id)["status"] == "queued", "refused forms change nothing"

    response = browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token})
    assert response.status_code == 303 and response.headers["location"] == f"/ui/jobs/{job_id}"
    assert _job(ui_world, job_id)["status"] == "cancelled"
    after = _budget(ui_world, alice_dataset)
    assert (
        after["reserved_epsilon"] == before["reserved_epsilon"]
        and after["remaining_epsilon"] == before["remaining_epsilon"]
    )
    done = parse(browser.get(f"/ui/jobs/{job_id}").text)
    assert not [e for e in done.elements if e.tag == "form" and "cancel" in e.attrs.get("action", "")]
    assert not done.tags("script"), "an ended job needs no stream"
    newest = done.inside(done.by_id("event-log"))[0]
    assert "Cancelled after 0 steps." in text_of(newest)

    again = browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token})
    assert again.status_code == 409 and "already ended (status: cancelled)" in again.text


def test_cancelling_a_running_job_asks_it_to_stop(ui_world: UiWorld, alice_dataset: str) -> None:
    job_id = ui_world.submit_job(ui_world.alice_key, dataset_id=alice_dataset)
    with ui_world.db.write_transaction() as tx:  # what the worker does when it starts the job
        tx.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="running", attempt=1, started_at=utcnow(), touched_at=utcnow() - dt.timedelta(seconds=1))
        )
    browser = ui_world.logged_in(ui_world.alice_key)
    token = csrf_token_of(browser.get(f"/ui/jobs/{job_id}").text)
    assert browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token}).status_code == 303
    job = _job(ui_world, job_id)
    assert job["status"] == "running" and job["cancel_requested"] is True
    page = parse(browser.get(f"/ui/jobs/{job_id}").text)
    (note,) = [e for e in page.elements if e.attrs.get("class") == "cancel-note muted"]
    assert "hidden" not in note.attrs
    (form,) = [e for e in page.elements if e.tag == "form" and "cancel" in e.attrs.get("action", "")]
    assert "hidden" in form.attrs, "asked once is enough"
    assert "cancel requested" in text_of(page.by_id("job-details")) and "· yes" in text_of(page.by_id("job-details"))
    assert "Cancel requested: the job stops after its current step." in text_of(page.by_id("event-log"))


def test_another_tenant_cannot_cancel(ui_world: UiWorld, alice_dataset: str) -> None:
    job_id = ui_world.submit_job(ui_world.alice_key, dataset_id=alice_dataset)
    bob = ui_world.logged_in(ui_world.bob_key)
    token = csrf_token_of(bob.get("/ui/datasets").text)
    assert bob.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token}).status_code == 404
    assert _job(ui_world, job_id)["status"] == "queued"
    ui_world.client(ui_world.alice_key).post(f"/v1/jobs/{job_id}/cancel")


# ------------------------------------------------------------------------- the job page


def test_the_job_page_tells_its_events_in_words(ui_world: UiWorld) -> None:
    browser = ui_world.logged_in(ui_world.alice_key)
    html = browser.get(f"/ui/jobs/{ui_world.job_id}").text
    page = parse(html)
    api_events = ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{ui_world.job_id}/events").json()
    rows = page.inside(page.by_id("event-log"))
    rows = [e for e in rows if e.tag == "tr"]
    assert [int(r.attrs["data-seq"]) for r in rows] == [e["seq"] for e in reversed(api_events)], (
        "numbered by the job's own seq, never the table's global row id"
    )
    log = text_of(page.by_id("event-log"))
    assert "{" not in log, "no raw JSON"
    steps = api_events[-1]["payload"]["steps_run"]
    assert f"Step {steps} of {steps} done; ε spent so far" in log and "Attempt 1 started training." in log
    assert "Admitted by the budget filter and queued" in log
    assert "<th>attempt · cancel requested</th><td>1 · no</td>" in html, "booleans are words"
    details = text_of(page.by_id("job-details"))
    assert "True" not in details and "False" not in details
    assert not [e for e in page.elements if e.tag == "form" and "cancel" in e.attrs.get("action", "")]
    (epsilon,) = page.with_attr("data-field", "job_epsilon")
    assert epsilon.attrs["data-basis"] == "committed"
    assert "ε committed (what this job spent)" in text_of(page.by_id("job"))
    (bar,) = page.tags("progress")
    assert bar.attrs["value"] == bar.attrs["max"] == str(steps)


def test_a_queued_jobs_page_follows_it_live_with_a_cancel_button(ui_world: UiWorld) -> None:
    browser = ui_world.logged_in(ui_world.alice_key)
    response = browser.get(f"/ui/jobs/{ui_world.queued_job_id}")
    page = parse(response.text)
    (script,) = page.tags("script")
    assert f"'nonce-{script.attrs['nonce']}'" in response.headers["content-security-policy"]
    assert "EventSource" in script.text and "Step {step} of {steps_planned}" in script.text
    (epsilon,) = page.with_attr("data-field", "job_epsilon")
    assert epsilon.attrs["data-basis"] == "reserved"
    (spent,) = page.with_attr("data-field", "epsilon_spent")
    assert text_of(spent) == "0"
    assert [
        e
        for e in page.elements
        if e.tag == "form" and e.attrs.get("action") == f"/ui/jobs/{ui_world.queued_job_id}/cancel"
    ]
    assert "data-reload-when-done" in page.by_id("job").attrs


# ------------------------------------------------------------------------- invitations


@pytest.fixture(scope="module")
def bobs_datasets(ui_world: UiWorld) -> list[str]:
    """Two datasets of bob's, both offered to alice."""
    ids = [ui_world.upload_dataset(ui_world.bob_key, name=f"bob's <shared> {i}") for i in (1, 2)]
    for dataset_id in ids:
        ui_world.invite(ui_world.bob_key, dataset_id=dataset_id, tenant="alice")
    return ids


def _invitation_rows(html: str) -> dict[str, str]:
    page = parse(html)
    return {r.attrs["data-invitation"]: text_of(r) for r in page.with_attr("data-invitation")}


def _pending_ids(ui_world: UiWorld) -> set[str]:
    items = ui_world.client(ui_world.alice_key).get("/v1/invitations").json()["items"]
    return {i["dataset_id"] for i in items}


def test_invitations_are_listed_and_answered_from_the_datasets_page(
    ui_world: UiWorld, bobs_datasets: list[str]
) -> None:
    accepted, declined = bobs_datasets
    browser = ui_world.logged_in(ui_world.alice_key)
    html = browser.get("/ui/datasets").text
    rows = _invitation_rows(html)
    assert set(bobs_datasets) <= set(rows) and "bob" in rows[accepted]
    assert "&lt;shared&gt; 1" in html and "<shared>" not in html, "names are escaped"
    token = csrf_token_of(html)

    assert _post_form(browser, f"/ui/invitations/{accepted}/accept", None) == 403
    assert _post_form(browser, f"/ui/invitations/{accepted}/accept", token, **{"Sec-Fetch-Site": "cross-site"}) == 403
    assert set(bobs_datasets) <= _pending_ids(ui_world), "refused forms answer nothing"

    response = browser.post(f"/ui/invitations/{accepted}/accept", data={"csrf_token": token})
    assert response.status_code == 303 and response.headers["location"] == "/ui/datasets"
    response = browser.post(f"/ui/invitations/{declined}/decline", data={"csrf_token": token})
    assert response.status_code == 303
    assert not set(bobs_datasets) & _pending_ids(ui_world)

    page = parse(browser.get("/ui/datasets").text)
    assert not set(bobs_datasets) & set(_invitation_rows(browser.get("/ui/datasets").text))
    listed = {r.attrs["data-dataset-id"]: text_of(r) for r in page.with_attr("data-dataset-id")}
    assert "shared by bob" in listed[accepted] and declined not in listed
    shared = browser.get(f"/ui/datasets/{accepted}")
    assert shared.status_code == 200 and "Only the dataset's owner sees its ledger" in shared.text
    assert not parse(shared.text).with_attr("data-seq"), "an analyst sees no ledger entries"
    assert browser.get(f"/ui/datasets/{declined}").status_code == 404

    gone = browser.post(f"/ui/invitations/{accepted}/accept", data={"csrf_token": token})
    assert gone.status_code == 404 and "No such invitation" in gone.text
    assert browser.post("/ui/invitations/ds_nothing/decline", data={"csrf_token": token}).status_code == 404


def test_an_invitation_is_only_answered_by_its_addressee(ui_world: UiWorld) -> None:
    dataset_id = ui_world.upload_dataset(ui_world.alice_key, name="for bob")
    ui_world.invite(ui_world.alice_key, dataset_id=dataset_id, tenant="bob")
    alice = ui_world.logged_in(ui_world.alice_key)
    token = csrf_token_of(alice.get("/ui/datasets").text)
    assert alice.post(f"/ui/invitations/{dataset_id}/accept", data={"csrf_token": token}).status_code == 404
    bob = ui_world.logged_in(ui_world.bob_key)
    assert dataset_id in _invitation_rows(bob.get("/ui/datasets").text)
    bob_token = csrf_token_of(bob.get("/ui/datasets").text)
    assert bob.post(f"/ui/invitations/{dataset_id}/decline", data={"csrf_token": bob_token}).status_code == 303
    assert dataset_id not in bob.get("/ui/datasets").text, "declined: neither offered nor listed"
