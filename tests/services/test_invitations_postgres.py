"""Invitations on PostgreSQL: concurrent invitations of one name leave one live row, and names
or ids PostgreSQL cannot even compare (NUL, lone surrogates) are refused before any query."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from kernel.bootstrap import migrate
from kernel.db.orm import DatasetGrant
from tests.concurrency_helpers import concurrency_settings, digits_csv, live_server
from tests.sharing import race_invitations

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]


def test_invitations_on_postgres(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> None:
    settings = concurrency_settings(tmp_path_factory.mktemp("invitations-postgres") / "data", database_url=postgres_url)
    assert settings.resolved_database_url.startswith("postgresql")
    migrate(settings)
    # Tenants of its own: the PostgreSQL database is shared by the session's service tests.
    with (
        live_server(settings) as live,
        live.client(live.tenant_key("invitations-owner")) as owner,
        live.client(live.tenant_key("invitations-analyst")) as bob,
    ):
        created = owner.post(
            "/v1/datasets",
            content=digits_csv(),
            params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
        )
        assert created.status_code == 201, created.text
        dataset_id = created.json()["id"]

        answers = race_invitations(owner, dataset_id=dataset_id, grantee_name="invitations-analyst", racers=16)
        assert sorted(a["status"] for a in answers) == [200] * 15 + [202]
        with live.db.read_session() as session:
            assert (
                session.scalar(
                    select(func.count()).select_from(DatasetGrant).where(DatasetGrant.dataset_id == dataset_id)
                )
                == 1
            )

        for name in ('"bo\\u0000b"', '"\\ud800"'):
            refused = owner.post(
                f"/v1/datasets/{dataset_id}/grants",
                content=f'{{"tenant": {name}}}',
                headers={"Content-Type": "application/json"},
            )
            assert refused.status_code == 422, refused.text
        assert owner.delete(f"/v1/datasets/{dataset_id}/grants/bo%00b").status_code == 404
        for path in ("ds_%00/accept", "%ED%A0%80/decline"):
            assert bob.post(f"/v1/invitations/{path}").status_code == 404
        assert bob.get("/v1/invitations").json()["items"][0]["id"] == dataset_id
        assert bob.post(f"/v1/invitations/{dataset_id}/accept").json()["status"] == "active"
        assert [d["id"] for d in bob.get("/v1/datasets").json()["items"]] == [dataset_id]
