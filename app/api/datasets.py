"""Dataset upload, listing, budget and ledger."""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import and_, or_, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from app import ledger
from app.access import Role, dataset_access, dataset_for, visible_datasets
from app.api.routing import ReleasingRoute
from app.api.deps import ServicesDep, SessionDep, TenantDep
from app.facts import public_class_list
from privtrain.directed_rounding import format_remaining
from app.ingest import (
    DatasetValidationError,
    IngestLimits,
    Preparation,
    dataset_facts,
    parse_class_list,
    parse_dataset,
    parse_preparation,
)
from app.ledger_explanations import explain_entries, jobs_of
from app.models import Dataset, LedgerEntry, PrivacyBudget, Tenant
from app.pagination import cursor_id, cursor_seq, cursor_time, decode_cursor, encode_cursor
from app.problems import Problem
from app.services import Services
from app.schemas.datasets import (
    BudgetIncrease,
    BudgetView,
    DatasetList,
    DatasetOut,
    LedgerEntryOut,
    LedgerPage,
)
from app.storage import PendingBlob, UploadTooLarge
from app.upload_pace import UploadPace, UploadTooSlow, receive_paced
from app.upload_slots import UploadSlotDep

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=ReleasingRoute)
log = logging.getLogger("privtrain.api.datasets")


def _check_name(name: str) -> str:
    if any(unicodedata.category(ch).startswith("C") for ch in name) or "/" in name or "\\" in name:
        raise Problem(
            status=422,
            slug="invalid-dataset-name",
            detail="name must not contain control characters or path separators",
        )
    return name


OWNER_LINKS = ("ledger", "grants")
"""Links only the owner can follow; an analyst's view does not advertise them."""


def dataset_out(dataset: Dataset, budget: PrivacyBudget, *, role: Role = "owner", listing: bool = False) -> DatasetOut:
    """One dataset as its caller may see it. A ``listing`` item leaves out the two per-dataset
    lists that grow with the data (feature names: up to 100,000 × 256 characters; the class
    list: up to 1,000 names), so a page of 200 stays a few hundred KB however wide the
    datasets are; ``GET /v1/datasets/{id}`` has them."""
    links = {
        "self": f"/v1/datasets/{dataset.id}",
        "budget": f"/v1/datasets/{dataset.id}/budget",
        "ledger": f"/v1/datasets/{dataset.id}/ledger",
        "grants": f"/v1/datasets/{dataset.id}/grants",
    }
    owner = role == "owner"
    if not owner:
        links = {name: href for name, href in links.items() if name not in OWNER_LINKS}
    classes = public_class_list(  # a listing does not load the names (deferred): only the source is used
        task=dataset.task, n_classes=dataset.n_classes, class_names=None if listing else dataset.class_names,
        declared=dataset.classes_declared,
    )
    return DatasetOut(
        id=dataset.id,
        name=dataset.name,
        format=dataset.format,
        # Exact functions of the rows: the owner's view only (docs/privacy-model.md §2).
        sha256=dataset.sha256 if owner else None,
        size_bytes=dataset.size_bytes if owner else None,
        n_rows=dataset.n_rows,
        feature_shape=list(dataset.feature_shape),
        n_features=dataset.n_features,
        task=dataset.task,
        n_classes=dataset.n_classes,
        classes=list(classes.names) if classes and not listing else None,
        classes_source=classes.source if classes else None,  # type: ignore[arg-type]
        label_column=dataset.label_column,
        preparation=None if listing else dataset.preparation,  # declared, public; bounded, yet left out of listings
        feature_names=None if listing else dataset.feature_names,
        budget={"epsilon": budget.epsilon, "delta": budget.delta},
        created_at=dataset.created_at,
        links=links,
        role=role,
    )


def _upload_hash(
    *, sha256: str, name: str, fmt: str, epsilon: float, delta: float, label_column: str | None,
    task: str | None, classes: tuple[str, ...] | None, preparation: Preparation | None = None,
) -> str:
    """What an upload asked for: its body's digest and every parameter."""
    request: dict[str, object] = {"sha256": sha256, "name": name, "format": fmt, "epsilon": epsilon,
                                  "delta": delta, "label_column": label_column, "task": task}
    if classes is not None:  # absent from digests made before class lists existed
        request["classes"] = list(classes)
    if preparation is not None:  # absent from digests made before preparations existed
        request["preparation"] = preparation.to_json()
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def _replayed_upload(services: Services, tenant: Tenant, key: str, digest: str) -> JSONResponse | None:
    """The dataset an earlier upload with this key registered (200), a 422 if the key was used
    for a different upload, or None if the key is new."""
    with services.db.read_session() as session:
        dataset = session.scalar(
            select(Dataset).where(Dataset.tenant_id == tenant.id, Dataset.idempotency_key == key)
        )
        if dataset is None:
            return None
        if dataset.request_hash != digest:
            raise Problem(status=422, slug="idempotency-key-reused",
                          detail="this Idempotency-Key was used with a different upload")
        budget = session.get(PrivacyBudget, dataset.id)
        assert budget is not None
        return JSONResponse(dataset_out(dataset, budget).model_dump(mode="json"), status_code=200)


class ContentAlreadyRegistered(Exception):
    """The tenant already registered these exact bytes: one content, one budget (docs/privacy-model.md §3)."""

    def __init__(self, existing: Dataset) -> None:
        super().__init__(existing.id)
        self.dataset_id = existing.id
        self.name = existing.name


def _registered_with_content(session: Session, tenant_id: str, sha256: str) -> Dataset | None:
    return session.scalar(
        select(Dataset)
        .where(Dataset.tenant_id == tenant_id, Dataset.sha256 == sha256)
        .order_by(Dataset.created_at, Dataset.id)
        .limit(1)
    )


def _already_registered_problem(exc: ContentAlreadyRegistered) -> Problem:
    return Problem(
        status=409,
        slug="dataset-already-registered",
        detail=(
            f"these bytes are already registered as dataset {exc.dataset_id} ({exc.name!r}); a "
            "second registration would give the same rows a second budget. To spend more on them, "
            f"raise that dataset's budget with POST /v1/datasets/{exc.dataset_id}/budget (recorded "
            "in its ledger and shown in every later report)"
        ),
        extra={"existing_dataset_id": exc.dataset_id,
               "links": {"existing": f"/v1/datasets/{exc.dataset_id}",
                         "raise_budget": f"/v1/datasets/{exc.dataset_id}/budget"}},
    )


def _refuse_known_content(services: Services, tenant: Tenant, sha256: str) -> None:
    """Early, cheap check before parsing; the binding check runs again under the tenant lock."""
    with services.db.read_session() as session:
        existing = _registered_with_content(session, tenant.id, sha256)
        if existing is not None:
            raise _already_registered_problem(ContentAlreadyRegistered(existing))


def _inferred_task_notice(task: str) -> str:
    return (
        f"no task was given, so it was inferred from the labels ({task}) and is now public. Give "
        "task= at upload to make it independent of the rows."
    )


def _observed_classes_notice(names: tuple[str, ...]) -> str:
    n_classes = len(names)
    found = (f"the {n_classes} labels found (0 to {n_classes - 1})"
             if names == tuple(str(i) for i in range(n_classes)) else
             f"the {n_classes} distinct labels found, sorted (a label's class is its position in the list),")
    return (
        f"no class list was declared, so {found} became "
        "this dataset's public class list: everyone who may read the dataset sees it. Declare the "
        "list at upload (classes=name0,name1,...) to make it independent of the rows."
    )


def _lock_blob_key(session: Session, key: str) -> None:
    """Serialise registrations and clean-ups of one content-addressed blob until commit.

    On PostgreSQL a transaction-scoped advisory lock on the key: a clean-up cannot check "no row
    uses this blob" and then delete it while another upload of the same bytes (any tenant) commits
    its row in between. SQLite's write transactions are already serialised (BEGIN IMMEDIATE).
    """
    if session.get_bind().dialect.name == "postgresql":
        lock_id = int.from_bytes(hashlib.sha256(f"blob:{key}".encode()).digest()[:8], "big", signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:lock_id)"), {"lock_id": lock_id})


def _discard_unreferenced_blob(services: Services, *, key: str) -> None:
    """Delete a blob this upload created but did not register, unless a dataset row uses it.

    Blobs are content-addressed, so a concurrent upload of the same bytes may have registered
    the very blob this failed upload wrote: the committed rows decide, not this request's fate.
    The check and the delete share one write transaction (on SQLite it serialises with every
    registration). If the check itself fails the blob is kept: a stray blob is harmless, a
    registered dataset without its bytes is not.
    """
    try:
        with services.db.write_transaction() as session:
            _lock_blob_key(session, key)
            if session.scalar(select(Dataset.id).where(Dataset.blob_key == key).limit(1)) is None:
                services.blobs.delete(key)
    except Exception:  # noqa: BLE001 - cleanup must not mask the request's own outcome
        log.warning("could not check whether blob %s is referenced; kept", key, exc_info=True)


@router.post("", status_code=201, response_model=DatasetOut)
async def upload_dataset(
    request: Request,
    services: ServicesDep,
    tenant: TenantDep,
    _upload_slot: UploadSlotDep,
    name: Annotated[str, Query(min_length=1, max_length=200)],
    format: Annotated[str, Query(description="csv or npz")],
    epsilon: Annotated[float, Query(gt=0, le=100, allow_inf_nan=False)],
    delta: Annotated[float, Query(ge=1e-30, lt=1, allow_inf_nan=False, description="δ of the budget, in [1e-30, 1) (app.privacy.ranges.DELTA_MIN)")],
    label_column: Annotated[str | None, Query(max_length=200)] = None,
    task: Annotated[Literal["classification", "regression"] | None, Query(
        description="inferred only when the labels leave no doubt (text: classification; fractions: "
        "regression; whole numbers 0..K-1: classification); whole numbers not starting at 0 (1, 2) "
        "are refused as ambiguous unless task= or classes= is given",
    )] = None,
    classes: Annotated[str | None, Query(
        max_length=120_000,
        description="the public class list, comma-separated; declaring it means task=classification. "
        "Labels are matched by name (benign, or 2 with classes=1,2: never shifted); when no name is a "
        "number a label may also be an index 0..K-1. Declared, it is independent of the rows; when "
        "omitted, the labels found become the public list.",
    )] = None,
    preparation: Annotated[str | None, Query(
        description='the data preparation, a JSON object declared public: {"drop": ["patient_id"], '
        '"one_hot": {"sex": ["female", "male"]}, "scale": {"age": {"bounds": [0, 120]}, '
        '"*": {"center": 0, "scale": 10}}}. Dropped columns are never parsed or used; a one-hot column becomes '
        "one 0/1 feature per declared category (any other value is refused); bounds clip and "
        "min-max scale to [0, 1] (or \"range\": [-1, 1]); center/scale standardise. The worker "
        "applies it when it loads the rows. \"labels\": \"indices\" makes labels indices into a declared "
        "class list whose names are numbers. At most 16,000 characters (\"*\" scales every feature).",
    )] = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> DatasetOut | JSONResponse:
    """Stream the raw body to disk while hashing it, validate it, then register it with a budget.

    With an Idempotency-Key, a retried upload (same key, same body and parameters) answers 200
    with the dataset the first one registered: never a second dataset with its own budget. Bytes
    the tenant already registered otherwise get 409 ``dataset-already-registered``.
    """
    _check_name(name)
    settings = services.settings
    limits = IngestLimits.from_settings(settings)
    try:
        class_list = parse_class_list(classes, max_classes=limits.max_classes)
        declared_preparation = parse_preparation(preparation, limits=limits)
    except DatasetValidationError as exc:
        raise Problem(
            status=422, slug="invalid-dataset", detail=exc.detail, extra={"reason": exc.reason}
        ) from exc
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_upload_bytes:
        raise Problem(
            status=413,
            slug="payload-too-large",
            detail=f"upload exceeds the limit of {settings.max_upload_bytes} bytes",
        )
    pending = services.blobs.begin(max_bytes=settings.max_upload_bytes)
    try:
        await receive_paced(request.stream(), pending.write, pace=UploadPace.from_settings(settings))
    except UploadTooLarge as exc:
        pending.discard()
        raise Problem(
            status=413,
            slug="payload-too-large",
            detail=f"upload exceeds the limit of {settings.max_upload_bytes} bytes",
        ) from exc
    except UploadTooSlow as exc:
        pending.discard()
        raise _too_slow_problem(exc, UploadPace.from_settings(settings)) from None
    except BaseException:
        pending.discard()
        raise
    # Everything after the body (hashing, parsing, the registration transaction) is blocking
    # work: it runs in a worker thread, so a registration waiting on the database lock never
    # stalls the event loop (and with it every other request).
    return await run_in_threadpool(
        _register_upload, services=services, tenant=tenant, pending=pending, limits=limits,
        upload=UploadRequest(name=name, fmt=format, epsilon=epsilon, delta=delta, label_column=label_column,
                             task=task, class_list=class_list, idempotency_key=idempotency_key,
                             preparation=declared_preparation),
    )


def _too_slow_problem(exc: UploadTooSlow, pace: UploadPace) -> Problem:
    why = (f"nothing arrived for {pace.idle_timeout_s:g} s" if exc.reason == "idle" else
           f"the body arrived slower than {pace.min_rate_bytes_per_s:g} bytes/s on average")
    return Problem(
        status=408, slug="upload-too-slow",
        detail=f"upload refused after {exc.received} bytes in {exc.elapsed_s:.1f} s: {why}; nothing was stored",
        extra={"reason": exc.reason}, headers={"Connection": "close"},
    )


@dataclass(frozen=True)
class UploadRequest:
    """What an upload asked for, besides its body."""

    name: str
    fmt: str
    epsilon: float
    delta: float
    label_column: str | None
    task: str | None
    class_list: tuple[str, ...] | None
    idempotency_key: str | None
    preparation: Preparation | None = None


def _register_upload(
    *, services: Services, tenant: Tenant, pending: PendingBlob, limits: IngestLimits, upload: UploadRequest,
) -> DatasetOut | JSONResponse:
    """Validate a received body and register it with its budget (blocking: runs in a thread)."""
    name, format, epsilon, delta = upload.name, upload.fmt, upload.epsilon, upload.delta
    label_column, task, class_list, idempotency_key = (
        upload.label_column, upload.task, upload.class_list, upload.idempotency_key)
    try:
        sha256 = pending.finish()
        request_digest = _upload_hash(
            sha256=sha256, name=name, fmt=format, epsilon=epsilon, delta=delta,
            label_column=label_column, task=task, classes=class_list, preparation=upload.preparation,
        )
        if idempotency_key:
            replay = _replayed_upload(services, tenant, idempotency_key, request_digest)
            if replay is not None:
                pending.discard()
                return replay
        _refuse_known_content(services, tenant, sha256)
        try:
            parsed = parse_dataset(
                pending.path, fmt=format, label_column=label_column, task=task, limits=limits, classes=class_list,
                preparation=upload.preparation,
            )
        except DatasetValidationError as exc:
            raise Problem(
                status=422, slug="invalid-dataset", detail=exc.detail, extra={"reason": exc.reason}
            ) from exc
        facts = dataset_facts(parsed)
        feature_names = list(parsed.feature_names) if parsed.feature_names else None
        public_classes = parsed.classes
        del parsed
        if delta >= 1.0 / facts["n_rows"]:
            raise Problem(
                status=422,
                slug="invalid-budget",
                detail=f"delta must be below 1/n = {format_remaining(1.0 / facts['n_rows'])} for n = {facts['n_rows']} rows",
            )
        key, created = services.blobs.adopt(pending.path, sha256, keep_pending=True)
    except BaseException:
        pending.discard()
        raise
    class_names = public_classes.names if public_classes is not None else None
    n_classes = len(class_names) if class_names is not None else None
    notices = [] if class_list is not None or class_names is None else [_observed_classes_notice(class_names)]
    if task is None and class_list is None:
        notices.insert(0, _inferred_task_notice(str(facts["task"])))
    registered = False
    try:
        try:
            with services.db.write_transaction() as session:
                # One registration per content and tenant: serialised on the tenant row, so two
                # concurrent uploads of the same bytes cannot both pass the check.
                session.execute(select(Tenant.id).where(Tenant.id == tenant.id).with_for_update())
                _lock_blob_key(session, key)  # a failed upload's clean-up cannot race this row
                existing = _registered_with_content(session, tenant.id, sha256)
                if existing is not None:
                    raise ContentAlreadyRegistered(existing)
                dataset = Dataset(
                    tenant_id=tenant.id,
                    name=name,
                    format=format,
                    sha256=sha256,
                    blob_key=key,
                    size_bytes=pending.size,
                    label_column=label_column,
                    n_rows=int(facts["n_rows"]),
                    feature_shape=[int(v) for v in facts["feature_shape"]],
                    n_features=int(facts["n_features"]),
                    task=str(facts["task"]),
                    n_classes=n_classes,
                    class_names=list(class_names) if class_names is not None else None,
                    classes_declared=class_list is not None,
                    preparation=upload.preparation.to_json() if upload.preparation is not None else None,
                    feature_names=feature_names,
                    idempotency_key=idempotency_key,
                    request_hash=request_digest if idempotency_key else None,
                )
                session.add(dataset)
                session.flush()
                budget = ledger.open_budget(session, dataset=dataset, epsilon=epsilon, delta=delta)
                session.flush()
                out = dataset_out(dataset, budget).model_copy(update={"notices": notices})
            registered = True
        except IntegrityError:
            # A concurrent upload with the same key registered first: a replay (200), or 422
            # idempotency-key-reused if it was a different upload; either way ours is not stored.
            replay = _replayed_upload(services, tenant, idempotency_key, request_digest) if idempotency_key else None
            if replay is None:
                raise
            return replay
        except ContentAlreadyRegistered as exc:
            if idempotency_key:  # a concurrent retry with the same key won the race
                replay = _replayed_upload(services, tenant, idempotency_key, request_digest)
                if replay is not None:
                    return replay
            raise _already_registered_problem(exc) from None
        if not created:  # the blob was another upload's: restore it if that one failed and removed it
            services.blobs.adopt(pending.path, sha256)
    finally:
        if created and not registered:
            _discard_unreferenced_blob(services, key=key)
        pending.discard()
    log.info("dataset registered", extra={"dataset_id": out.id, "tenant_id": tenant.id})
    return out


@router.get("", response_model=DatasetList)
def list_datasets(
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> DatasetList:
    """The datasets the caller owns or holds an accepted, unrevoked grant on, each with its
    ``role``. Items are bounded summaries: no feature names, no class list (see ``dataset_out``)."""

    query = (
        select(Dataset, PrivacyBudget)
        .join(PrivacyBudget)
        .where(visible_datasets(tenant))
        .options(defer(Dataset.feature_names), defer(Dataset.class_names), defer(Dataset.preparation))  # megabytes on wide datasets
    )
    if cursor:
        created_at, last_id = decode_cursor(cursor, fields=(cursor_time, cursor_id))
        query = query.where(
            or_(
                Dataset.created_at < created_at,
                and_(Dataset.created_at == created_at, Dataset.id < last_id),
            )
        )
    rows = session.execute(
        query.order_by(Dataset.created_at.desc(), Dataset.id.desc()).limit(limit + 1)
    ).all()
    items = [
        dataset_out(d, b, role="owner" if d.tenant_id == tenant.id else "analyst", listing=True)
        for d, b in rows[:limit]
    ]
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1][0]
        next_cursor = encode_cursor([last.created_at.isoformat(), last.id])
    return DatasetList(items=items, next_cursor=next_cursor)


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: str, session: SessionDep, tenant: TenantDep) -> DatasetOut:
    access = dataset_access(session, tenant, dataset_id, need="read")
    budget = session.get(PrivacyBudget, access.dataset.id)
    assert budget is not None
    return dataset_out(access.dataset, budget, role=access.role)


@router.get("/{dataset_id}/budget", response_model=BudgetView)
def get_budget(dataset_id: str, session: SessionDep, tenant: TenantDep) -> BudgetView:
    dataset = dataset_for(session, tenant, dataset_id, need="read")
    budget = session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    return BudgetView(**ledger.budget_summary(budget))


@router.post("/{dataset_id}/budget", response_model=BudgetView)
def raise_budget(
    dataset_id: str, body: BudgetIncrease, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> BudgetView:
    """Raise ε (and optionally δ): only the owner can, and only upwards (privacy.md §4)."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    session.close()  # give the read connection back before taking a write one
    with services.db.write_transaction() as tx:
        budget = ledger.lock_budget(tx, dataset.id)
        try:
            ledger.adjust(
                tx,
                budget,
                epsilon=body.epsilon,
                delta=body.delta if body.delta is not None else budget.delta,
                n_rows=dataset.n_rows,
                actor=f"tenant:{tenant.id}",
                reason=body.reason,
            )
        except ledger.InvalidAdjustment as exc:
            raise Problem(status=422, slug="invalid-budget", detail=str(exc)) from None
        tx.flush()
        view = BudgetView(**ledger.budget_summary(budget))
    log.info("budget raised", extra={"dataset_id": dataset.id, "tenant_id": tenant.id})
    return view


@router.get("/{dataset_id}/ledger", response_model=LedgerPage)
def get_ledger(
    dataset_id: str,
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: str | None = None,
) -> LedgerPage:
    """The full ledger (every job's entries and actors): the owner's view only."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    budget = session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    (after,) = decode_cursor(cursor, fields=(cursor_seq,)) if cursor else (0,)
    entries = list(
        session.scalars(
            select(LedgerEntry)
            .where(LedgerEntry.dataset_id == dataset.id, LedgerEntry.seq > after)
            .order_by(LedgerEntry.seq)
            .limit(limit + 1)
        )
    )

    page = entries[:limit]
    explanations = explain_entries(page, jobs=jobs_of(session, page), dataset_delta=budget.delta)
    items = [
        LedgerEntryOut(
            seq=e.seq,
            kind=e.kind,
            job_id=e.job_id,
            event=e.event,
            curve=e.curve,
            epsilon=ledger.curve_epsilon(e.curve, budget.delta) if e.curve else None,
            explanation=explanation,
            orders_version=e.orders_version,
            accountant=e.accountant,
            accountant_version=e.accountant_version,
            actor=e.actor,
            details=e.details,
            created_at=e.created_at,
            prev_hash=e.prev_hash,
            hash=e.hash,
        )
        for e, explanation in zip(page, explanations, strict=True)
    ]
    next_cursor = encode_cursor([entries[limit - 1].seq]) if len(entries) > limit else None
    return LedgerPage(items=items, next_cursor=next_cursor)
