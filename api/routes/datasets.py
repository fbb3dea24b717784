"""Dataset upload, listing, deletion, budget and ledger."""

from __future__ import annotations

import logging
import unicodedata
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, defer

from api.limits.upload_slots import UploadSlotDep
from api.problems import Problem
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.routing import ReleasingRoute
from api.routes.upload_body import receive_upload_body, upload_request_body
from api.routes.upload_watch import WatchedParse
from kernel.access.roles import Role, dataset_access, dataset_for, visible_datasets
from kernel.datasets.deletion import DatasetEraser, DeletionProgress, deletion_progress, request_deletion
from kernel.datasets.facts import privacy_unit_text, public_class_list
from kernel.datasets.registration import register_upload
from kernel.datasets.status import DatasetStatus, require_active
from kernel.datasets.upload_refusals import invalid_dataset, invalid_text
from kernel.datasets.upload_request import UploadRequest
from kernel.db.orm import Dataset, LedgerEntry, PrivacyBudget
from kernel.db.pagination import cursor_id, cursor_seq, cursor_time, decode_cursor, encode_cursor
from kernel.errors import InvalidInput
from kernel.ingest import (
    DatasetValidationError,
    ImageOptions,
    IngestLimits,
    check_channels,
    parse_class_list,
    parse_image_size,
    parse_preparation,
)
from kernel.ingest.jsonl import JsonlFields
from kernel.ingest.text import DEFAULT_MAX_LENGTH, TEXT_FORMATS, TextOptions
from kernel.ingest.text_errors import TextValidationError
from kernel.ledger import operations as ledger
from kernel.ledger.explanations import explain_entries, jobs_of
from kernel.schemas.datasets import (
    BudgetIncrease,
    BudgetOut,
    BudgetView,
    DatasetList,
    DatasetOut,
    DeletionOut,
    LedgerEntryOut,
    LedgerPage,
)

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
PRIVACY_LINKS = ("budget", "ledger")
"""Links a public dataset does not have (docs/pretraining-and-finetuning.md)."""
"""Links only the owner can follow; an analyst's view does not advertise them."""


def image_shape(dataset: Dataset) -> list[int] | None:
    """An image dataset's [H, W, C] from its public (C, H, W) feature shape."""
    if dataset.modality != "image":
        return None
    channels, height, width = dataset.feature_shape
    return [int(height), int(width), int(channels)]


def deletion_out(dataset: Dataset, progress: DeletionProgress | None) -> DeletionOut | None:
    """The deletion block of the owner's view (None while active); ``progress`` only in single views."""
    if dataset.deletion_requested_at is None:
        return None
    return DeletionOut(
        requested_at=dataset.deletion_requested_at,
        deleted_at=dataset.deleted_at,
        models="deleted" if dataset.delete_models else "kept",
        jobs_settling=progress.jobs_settling if progress is not None else None,
        models_pending=progress.models_pending if progress is not None else None,
    )


def dataset_out(
    dataset: Dataset,
    budget: PrivacyBudget,
    *,
    role: Role = "owner",
    listing: bool = False,
    progress: DeletionProgress | None = None,
) -> DatasetOut:
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
    if dataset.public:  # no budget and no ledger to link to
        links = {name: href for name, href in links.items() if name not in PRIVACY_LINKS}
    if not owner:
        links = {name: href for name, href in links.items() if name not in OWNER_LINKS}
    classes = public_class_list(  # a listing does not load the names (deferred): only the source is used
        task=dataset.task,
        n_classes=dataset.n_classes,
        class_names=None if listing else dataset.class_names,
        declared=dataset.classes_declared,
    )
    return DatasetOut(
        id=dataset.id,
        name=dataset.name,
        format=dataset.format,
        status=DatasetStatus(dataset.status).value,
        deletion=deletion_out(dataset, progress),
        # Exact functions of the rows: the owner's view only (docs/privacy-model.md §2).
        sha256=dataset.sha256 if owner else None,
        content_digest=dataset.content_digest if owner else None,
        size_bytes=dataset.size_bytes if owner else None,
        # A unit-level dataset's exact row count is a function of the rows: the owner's, unless declared public.
        n_rows=dataset.n_rows if owner or dataset.n_rows_public else None,
        n_rows_public=dataset.n_rows_public,
        feature_shape=list(dataset.feature_shape),
        modality="image" if dataset.modality == "image" else "text" if dataset.modality == "text" else "tabular",
        image_shape=image_shape(dataset),
        tokenizer_id=dataset.tokenizer_id,
        vocab_size=dataset.vocab_size,
        pad_id=dataset.pad_id,
        max_length=int(dataset.feature_shape[0]) if dataset.modality == "text" else None,
        text_field=dataset.text_field,
        n_features=dataset.n_features,
        task=dataset.task,
        n_classes=dataset.n_classes,
        classes=list(classes.names) if classes and not listing else None,
        classes_source=classes.source if classes else None,
        label_column=dataset.label_column,
        privacy_unit_column=dataset.privacy_unit_column,
        n_units=dataset.n_units,
        privacy_unit=privacy_unit_text(dataset.privacy_unit_column),
        preparation=None if listing else dataset.preparation,  # declared, public; bounded, yet left out of listings
        feature_names=None if listing else dataset.feature_names,
        budget=None if dataset.public else BudgetOut(epsilon=budget.epsilon, delta=budget.delta),
        public=dataset.public,
        created_at=dataset.created_at,
        links=links,
        role=role,
    )


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=upload_request_body(
        "text/csv",
        "application/zip",
        "application/x-ndjson",
        "application/octet-stream",
        description="the dataset file's bytes: CSV, NPZ, a ZIP of class folders of images, or JSON Lines of text "
        "(format= names which)",
    ),
)
async def upload_dataset(
    request: Request,
    services: ServicesDep,
    tenant: TenantDep,
    _upload_slot: UploadSlotDep,
    name: Annotated[str, Query(min_length=1, max_length=200)],
    format: Annotated[
        str,
        Query(
            description="csv, npz, zip (a ZIP of class folders of PNG/JPEG images; docs/preparing-data.md), "
            "or jsonl (JSON Lines texts, tokenised at upload; docs/text.md)"
        ),
    ],
    epsilon: Annotated[
        float | None, Query(gt=0, le=100, allow_inf_nan=False, description="ε of the budget; required unless public")
    ] = None,
    delta: Annotated[
        float | None,
        Query(
            ge=1e-30,
            lt=1,
            allow_inf_nan=False,
            description="δ of the budget, in [1e-30, 1) (kernel.privacy.ranges.DELTA_MIN); required unless public",
        ),
    ] = None,
    label_column: Annotated[str | None, Query(max_length=200)] = None,
    task: Annotated[
        Literal["classification", "regression", "language-model"] | None,
        Query(
            description="a text (jsonl) dataset is classification when its records carry the label member "
            "and language-model when they do not; task= must agree. Otherwise inferred only when the labels "
            "leave no doubt (text: classification; fractions: "
            "regression; whole numbers 0..K-1: classification); whole numbers not starting at 0 (1, 2) "
            "are refused as ambiguous unless task= or classes= is given",
        ),
    ] = None,
    classes: Annotated[
        str | None,
        Query(
            max_length=120_000,
            description="the public class list, comma-separated; declaring it means task=classification. "
            "Labels are matched by name (benign, or 2 with classes=1,2: never shifted); when no name is a "
            "number a label may also be an index 0..K-1. Declared, it is independent of the rows; when "
            "omitted, the labels found become the public list.",
        ),
    ] = None,
    preparation: Annotated[
        str | None,
        Query(
            description='the data preparation, a JSON object declared public: {"drop": ["patient_id"], '
            '"one_hot": {"sex": ["female", "male"]}, "scale": {"age": {"bounds": [0, 120]}, '
            '"*": {"center": 0, "scale": 10}}}. Dropped columns are never parsed or used; a one-hot column becomes '
            "one 0/1 feature per declared category (any other value is refused); bounds clip and "
            'min-max scale to [0, 1] (or "range": [-1, 1]); center/scale standardise. The worker '
            'applies it when it loads the rows. "labels": "indices" makes labels indices into a declared '
            'class list whose names are numbers. At most 16,000 characters ("*" scales every feature).',
        ),
    ] = None,
    modality: Annotated[
        Literal["tabular", "image", "text"] | None,
        Query(
            description="image or tabular; when omitted, zip is image, csv is tabular, and an npz is image "
            "when its X is uint8 with 3 or 4 dimensions ((n, H, W) or (n, H, W, C), channels-last), tabular "
            "otherwise. modality=tabular reads a uint8 X as numbers, as before image datasets existed",
        ),
    ] = None,
    image_size: Annotated[
        str | None,
        Query(
            max_length=20,
            description="HxW (e.g. 32x32) or one side (28): every ZIP image is resized to it (Pillow, bilinear); "
            "when omitted, all images must share one size",
        ),
    ] = None,
    channels: Annotated[
        int | None,
        Query(
            description="1 (grey) or 3 (RGB): every image is converted to it; when omitted, a ZIP takes it "
            "from its first image (sorted by path) and an NPZ from X's last axis",
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        Query(
            max_length=45,
            description='text (jsonl) only: "byte" (built in, the default), the id of one of your tokenizers '
            '(GET /v1/tokenizers), or "base:<base_model_id>" for the tokenizer a Transformers checkpoint came with',
        ),
    ] = None,
    max_length: Annotated[
        int | None,
        Query(
            description=f"text (jsonl) only: tokens kept per row (default {DEFAULT_MAX_LENGTH}); longer texts are "
            "truncated, shorter ones right-padded with the tokenizer's pad id",
        ),
    ] = None,
    text_field: Annotated[
        str | None,
        Query(min_length=1, max_length=200, description='text (jsonl) only: the text member (default "text")'),
    ] = None,
    label_field: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description='text (jsonl) only: the label member (default "label"); records without it make a '
            "language-model dataset",
        ),
    ] = None,
    privacy_unit_column: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="csv: the column (jsonl: the member of each record) naming the person, or other unit, "
            "each row belongs to, e.g. patient_id. The privacy unit then becomes one unit and all its rows: jobs "
            "sample units, bound each unit's contribution and are charged per unit; the column is never a feature, "
            "and the number of units (n_units) becomes public like n. Cannot be changed later; see "
            "docs/privacy-units.md",
        ),
    ] = None,
    n_rows_public: Annotated[
        bool,
        Query(
            description="with privacy_unit_column: declare the exact row count public. By default only the owner "
            "sees n_rows on such a dataset: it changes by a removed unit's row count, so it is an exact function of "
            "the rows (docs/privacy-units.md#the-row-count); n_units stays public. Without privacy_unit_column the "
            "row count is the number of units and always public (this flag is then refused)",
        ),
    ] = False,
    public: Annotated[
        bool,
        Query(
            description="declare the dataset public: no budget (leave out epsilon and delta), no ledger, "
            "non-private optimizers allowed; see docs/pretraining-and-finetuning.md",
        ),
    ] = False,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> DatasetOut | JSONResponse:
    """Stream the raw body to disk while hashing it, validate it, then register it with a budget.

    With an Idempotency-Key, a retried upload (same key, same body and parameters) answers 200
    with the dataset the first one registered: never a second dataset with its own budget. Bytes
    the tenant already registered otherwise get 409 ``dataset-already-registered``.
    """
    _check_name(name)
    budget_epsilon, budget_delta = _declared_budget(public=public, epsilon=epsilon, delta=delta)
    settings = services.settings
    limits = IngestLimits.from_settings(settings)
    try:
        class_list = parse_class_list(classes, max_classes=limits.max_classes)
        declared_preparation = parse_preparation(preparation, limits=limits)
        image_options = ImageOptions(channels=check_channels(channels), size=parse_image_size(image_size))
        text_options = _text_options(
            fmt=format,
            modality=modality,
            tokenizer=tokenizer,
            max_length=max_length,
            text_field=text_field,
            label_field=label_field,
            unit_field=privacy_unit_column,
        )
        _check_privacy_unit_column(privacy_unit_column, fmt=format, public=public)
        _check_n_rows_public(n_rows_public, privacy_unit_column=privacy_unit_column)
    except DatasetValidationError as exc:
        raise invalid_dataset(exc) from exc
    except TextValidationError as exc:
        raise invalid_text(exc) from exc
    pending = await receive_upload_body(request, settings=settings, blobs=services.blobs)
    # Everything after the body (hashing, parsing, the registration transaction) is blocking
    # work: it runs in a worker thread, so a registration waiting on the database lock never
    # stalls the event loop (and with it every other request). The parse stops at its deadline
    # or when the client disconnects (api/routes/upload_watch.py).
    registered = await WatchedParse(request, deadline_s=settings.upload_parse_deadline_s).run(
        register_upload,
        db=services.db,
        blobs=services.blobs,
        tenant_id=tenant.id,
        pending=pending,
        limits=limits,
        upload=UploadRequest(
            name=name,
            fmt=format,
            epsilon=budget_epsilon,
            delta=budget_delta,
            label_column=label_column,
            task=task,
            class_list=class_list,
            idempotency_key=idempotency_key,
            preparation=declared_preparation,
            public=public,
            modality=modality,
            image_options=image_options,
            text_options=text_options,
            privacy_unit_column=privacy_unit_column,
            n_rows_public=n_rows_public,
        ),
    )
    out = dataset_out(registered.dataset, registered.budget)
    if registered.replayed:
        return JSONResponse(out.model_dump(mode="json"), status_code=200)
    return out.model_copy(update={"notices": list(registered.notices), "ledger_continued": registered.continued})


def _check_n_rows_public(n_rows_public: bool, *, privacy_unit_column: str | None) -> None:
    """``n_rows_public`` declares something only where the row count is not the unit count."""
    if n_rows_public and privacy_unit_column is None:
        raise InvalidInput(
            slug="n-rows-public-without-privacy-unit",
            detail="n_rows_public applies only with privacy_unit_column: without one the privacy unit is a row, and "
            "the row count (the number of units) is public by design; leave n_rows_public out",
        )


def _check_privacy_unit_column(column: str | None, *, fmt: str, public: bool) -> None:
    """Refused before the body is read: a unit column only means something for a private CSV."""
    if column is None:
        return
    if public:
        raise InvalidInput(
            slug="privacy-unit-on-public-dataset",
            detail="privacy_unit_column: a public dataset has no privacy guarantee to give per person; leave it out, "
            "or upload the dataset with a budget (epsilon=, delta=)",
        )
    if fmt not in ("csv", *TEXT_FORMATS):
        raise DatasetValidationError(
            "privacy-unit-unsupported-format",
            f"privacy_unit_column names a CSV column or a JSON Lines member; format={fmt} has neither. Upload the "
            "rows as a CSV with an identifier column (or texts as JSON Lines with a member naming the person) to "
            "train with one privacy unit per person",
        )


def _text_options(
    *,
    fmt: str,
    modality: str | None,
    tokenizer: str | None,
    max_length: int | None,
    text_field: str | None,
    label_field: str | None,
    unit_field: str | None = None,
) -> TextOptions | None:
    """A jsonl upload's text options (defaults filled); None for other formats, which must not
    declare any (a declaration that would be silently ignored is refused)."""
    if fmt not in TEXT_FORMATS:
        if modality == "text":
            raise TextValidationError("bad-text-options", f"modality=text needs format={' or '.join(TEXT_FORMATS)}")
        if (tokenizer, max_length, text_field, label_field) != (None, None, None, None):
            raise TextValidationError(
                "bad-text-options", "tokenizer=, max_length=, text_field= and label_field= apply only to format=jsonl"
            )
        return None
    if modality not in (None, "text"):
        raise TextValidationError("bad-text-options", "a jsonl upload is text: modality=text")
    defaults = TextOptions()
    return TextOptions(
        tokenizer=tokenizer or defaults.tokenizer,
        max_length=max_length if max_length is not None else defaults.max_length,
        fields=JsonlFields(
            text=text_field or defaults.fields.text, label=label_field or defaults.fields.label, unit=unit_field
        ),
    )


def _declared_budget(*, public: bool, epsilon: float | None, delta: float | None) -> tuple[float, float]:
    """The upload's (ε, δ): both required for a private dataset, both refused for a public one
    (it has no budget; its row holds 0, 0 and is only the lock its jobs' transitions take)."""
    if public:
        if epsilon is not None or delta is not None:
            raise Problem(
                status=422,
                slug="invalid-budget",
                detail="a public dataset has no privacy budget: leave out epsilon and delta with public=true",
            )
        return 0.0, 0.0
    if epsilon is None or delta is None:
        missing = [name for name, value in (("epsilon", epsilon), ("delta", delta)) if value is None]
        raise Problem(
            status=422,
            slug="validation-error",
            detail=f"query.{missing[0]}: Field required (every dataset that is not public needs a budget)",
            extra={
                "errors": [{"loc": ["query", name], "msg": "Field required", "type": "missing"} for name in missing]
            },
        )
    return epsilon, delta


def _refuse_public(dataset: Dataset) -> None:
    if dataset.public:
        raise Problem(
            status=409,
            slug="public-dataset",
            detail="this dataset is public: it has no privacy budget and no ledger",
        )


@router.get("", response_model=DatasetList)
def list_datasets(
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
    include_deleted: Annotated[
        bool, Query(description="also list the caller's deleted datasets (tombstones: ledger kept, rows erased)")
    ] = False,
) -> DatasetList:
    """The datasets the caller owns or holds an accepted, unrevoked grant on, each with its
    ``role``. Items are bounded summaries: no feature names, no class list (see ``dataset_out``).
    Datasets being deleted are listed (``status: deleting``); deleted ones only on request."""

    query = (
        select(Dataset, PrivacyBudget)
        .join(PrivacyBudget)
        .where(visible_datasets(tenant))
        .options(
            defer(Dataset.feature_names), defer(Dataset.class_names), defer(Dataset.preparation)
        )  # megabytes on wide datasets
    )
    if not include_deleted:
        query = query.where(Dataset.status != DatasetStatus.DELETED)
    if cursor:
        created_at, last_id = decode_cursor(cursor, fields=(cursor_time, cursor_id))
        query = query.where(
            or_(
                Dataset.created_at < created_at,
                and_(Dataset.created_at == created_at, Dataset.id < last_id),
            )
        )
    rows = session.execute(query.order_by(Dataset.created_at.desc(), Dataset.id.desc()).limit(limit + 1)).all()
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
    progress = deletion_progress(session, access.dataset)
    return dataset_out(access.dataset, budget, role=access.role, progress=progress)


def _current_view(session: Session, dataset_id: str) -> tuple[DatasetOut, DatasetStatus]:
    dataset = session.get(Dataset, dataset_id)
    budget = session.get(PrivacyBudget, dataset_id)
    assert dataset is not None and budget is not None
    progress = deletion_progress(session, dataset)
    return dataset_out(dataset, budget, progress=progress), progress.status


@router.delete(
    "/{dataset_id}",
    response_model=DatasetOut,
    responses={
        202: {
            "model": DatasetOut,
            "description": "deletion in progress (status deleting): jobs are stopping, or its files could not all "
            "be erased yet; the worker settling its last job or the reconciler finishes it, and DELETE may be "
            "repeated",
        }
    },
)
def delete_dataset(
    dataset_id: str,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
    models: Annotated[
        Literal["keep", "delete"],
        Query(
            description="keep (default) or delete the models of the dataset's jobs (every submitter's). Their "
            "reports are kept either way: the ledger points at them, and they hold no rows",
        ),
    ] = "keep",
) -> DatasetOut | JSONResponse:
    """Owner only: delete the dataset. Its grants end and its jobs stop at once (queued ones are
    released; running ones commit the steps they ran, a tuning its whole reservation); once they
    have settled, its uploaded file, decoded arrays and every job's checkpoints and hold-out splits
    are erased from the store and its caches, and the models too with ``models=delete``. The
    dataset stays as a tombstone for its owner: public facts, budget, hash-chained ledger and jobs.
    Uploading the same rows again continues that ledger.

    200 with the tombstone (status ``deleted``) when it is done; 202 (status ``deleting``) while
    jobs are still settling. Idempotent: repeat it to see the state, or to turn ``keep`` into
    ``delete`` for the models."""
    dataset = dataset_for(session, tenant, dataset_id, need="delete")
    session.close()  # give the read connection back before taking a write one
    request_deletion(services.db, dataset_id=dataset.id, owner=tenant, delete_models=models == "delete")
    try:
        DatasetEraser.from_settings(services.settings, db=services.db, blobs=services.blobs).finish(dataset.id)
    except Exception:  # the deletion stands; the reconciler's next round (or a repeated DELETE) resumes it
        log.warning("erasing a deleted dataset failed; retried later", extra={"dataset_id": dataset.id}, exc_info=True)
    with services.db.read_session() as fresh:
        out, status = _current_view(fresh, dataset.id)
    log.info("dataset deletion", extra={"dataset_id": dataset.id, "tenant_id": tenant.id, "status": status.value})
    return JSONResponse(out.model_dump(mode="json"), status_code=200 if status == DatasetStatus.DELETED else 202)


@router.get("/{dataset_id}/budget", response_model=BudgetView)
def get_budget(dataset_id: str, session: SessionDep, tenant: TenantDep) -> BudgetView:
    dataset = dataset_for(session, tenant, dataset_id, need="read")
    _refuse_public(dataset)
    budget = session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    return BudgetView(**ledger.budget_summary(budget))


@router.post("/{dataset_id}/budget", response_model=BudgetView)
def raise_budget(
    dataset_id: str, body: BudgetIncrease, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> BudgetView:
    """Raise ε (and optionally δ): only the owner can, and only upwards (docs/privacy-model.md §4)."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    _refuse_public(dataset)
    require_active(dataset)
    session.close()  # give the read connection back before taking a write one
    with services.db.write_transaction() as tx:
        budget = ledger.lock_budget(tx, dataset.id)
        current = tx.get(Dataset, dataset.id, populate_existing=True)
        assert current is not None
        require_active(current)  # a deletion that committed meanwhile wins
        try:
            ledger.adjust(
                tx,
                budget,
                epsilon=body.epsilon,
                delta=body.delta if body.delta is not None else budget.delta,
                n_rows=dataset.n_rows if dataset.n_units is None else dataset.n_units,  # δ < 1/(number of units)
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
    _refuse_public(dataset)
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
