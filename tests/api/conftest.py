"""Fixtures shared by the API tests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.conftest import upload


@pytest.fixture
def dataset_id(alice: TestClient, digits_csv: bytes) -> str:
    """Alice's digits dataset (ε_G = 8, δ_G = 1e-5)."""
    response = upload(alice, digits_csv)
    assert response.status_code == 201, response.text
    return response.json()["id"]
