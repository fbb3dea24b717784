"""A tenant, a dataset and its opened budget written directly, for ledger-level tests."""

from __future__ import annotations

from kernel.db.engine import Database
from kernel.db.orm import Dataset, Tenant
from kernel.ledger import operations as ledger


def budgeted_dataset(db: Database, *, tenant: str = "t", epsilon: float = 8.0, delta: float = 1e-5) -> str:
    with db.write_transaction() as s:
        owner = Tenant(name=tenant)
        s.add(owner)
        s.flush()
        dataset = Dataset(
            tenant_id=owner.id,
            name="d",
            format="csv",
            sha256="0" * 64,
            blob_key="k",
            size_bytes=1,
            n_rows=10_000,
            feature_shape=[4],
            n_features=4,
            task="regression",
        )
        s.add(dataset)
        s.flush()
        ledger.open_budget(s, dataset=dataset, epsilon=epsilon, delta=delta)
        return dataset.id
