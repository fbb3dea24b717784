"""Test helper: share a dataset the way a user must, by an invitation the analyst accepts."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from fastapi.testclient import TestClient


def share(
    client: TestClient,
    *,
    dataset_id: str,
    owner: dict[str, str] | None = None,
    grantee_name: str,
    grantee: dict[str, str],
) -> dict[str, Any]:
    """The owner (``owner`` headers, or the client's own) invites ``grantee_name`` and the
    grantee (its headers) accepts; returns the accepted invitation."""
    invited = client.post(f"/v1/datasets/{dataset_id}/grants", headers=owner, json={"tenant": grantee_name})
    assert invited.status_code == 202, invited.text
    accepted = client.post(f"/v1/invitations/{dataset_id}/accept", headers=grantee)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["status"] == "active"
    return accepted.json()


def race_invitations(client: httpx.Client, *, dataset_id: str, grantee_name: str, racers: int) -> list[dict[str, Any]]:
    """``racers`` threads invite the same name at once (a barrier releases them together);
    returns each answer's status and body."""
    start = threading.Barrier(racers)
    answers: list[dict[str, Any]] = []

    def invite() -> None:
        start.wait()
        response = client.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": grantee_name})
        answers.append({"status": response.status_code, "body": response.json()})

    threads = [threading.Thread(target=invite) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers
