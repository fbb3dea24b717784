"""The FastAPI application factory."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from api.limits.rate_limit import RateLimiter, RateLimitMiddleware, principal_resolver
from api.limits.request_cap import RequestCapMiddleware, RequestCaps
from api.problems import document_problems, install_problem_handlers
from api.routes import (
    base_models,
    catalogue,
    datasets,
    generation,
    grants,
    health,
    invitations,
    jobs,
    tokenizers,
    tuning,
    ui,
)
from api.routes.docs_pages import install_docs_pages
from api.routes.domain_errors import install_domain_error_handler
from api.routes.ui_session import session_secret
from kernel.access.verified_keys import KnownKeys, lookup_active_key
from kernel.bootstrap import register_bootstrap_key
from kernel.config import Settings, get_settings
from kernel.reconciler import run_periodically
from kernel.services import JobDispatcher, Services, build_services

THREAD_HEADROOM = 8
"""Threads of the shared pool beyond the request cap: a request's teardown after its answer, and
anything not counted. With the default cap (32) the pool keeps AnyIO's default of 40."""


def size_thread_pool(max_concurrent_requests: int) -> None:
    """Make the running event loop's shared thread pool (sync routes, sync dependencies) large
    enough that a request the cap admitted never waits for a thread; never shrink it."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = max(int(limiter.total_tokens), max_concurrent_requests + THREAD_HEADROOM)


def create_app(
    settings: Settings | None = None,
    *,
    dispatcher: JobDispatcher | None = None,
    services: Services | None = None,
) -> FastAPI:
    settings = settings or get_settings()
    settings.check_safe()
    services = services or build_services(settings, dispatcher)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        size_thread_pool(settings.max_concurrent_requests)
        if settings.bootstrap_api_key:
            register_bootstrap_key(services.db, settings.bootstrap_api_key)
        stop = threading.Event()
        reconciler = None
        if settings.run_reconciler:
            reconciler = threading.Thread(
                target=run_periodically,
                args=(services.db, settings, services.dispatcher, stop),
                name="privtrain-reconciler",
                daemon=True,
            )
            reconciler.start()
        yield
        stop.set()
        if reconciler is not None:
            reconciler.join(timeout=10)
        services.db.dispose()

    app = FastAPI(
        title="privtrain",
        version="0.1.0",
        summary="Differentially private model training with an auditable privacy budget ledger.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load from a CDN; api.routes.docs_pages serves them locally
        redoc_url=None,
    )
    install_docs_pages(app)
    app.state.services = services
    presented_key = principal_resolver(
        secret=functools.cache(lambda: session_secret(settings)), max_age_s=settings.ui_session_max_age_s
    )
    app.state.request_slots = RequestCaps.slots(
        per_key=settings.max_concurrent_requests_per_key,
        per_tenant=settings.max_concurrent_requests_per_tenant,
        per_address=settings.max_concurrent_requests_per_address,
        unverified=settings.max_concurrent_unverified_requests,
        total=settings.max_concurrent_requests,
    )
    app.state.known_keys = KnownKeys(lookup=functools.partial(lookup_active_key, services.db))
    # Added first, so it runs inside the rate limit: a rate-limited request takes no slot.
    app.add_middleware(
        RequestCapMiddleware,
        slots=app.state.request_slots,
        known_keys=app.state.known_keys,
        presented=presented_key,
    )
    if settings.rate_limit_per_minute > 0:
        app.add_middleware(
            RateLimitMiddleware,
            limiter=RateLimiter(per_minute=settings.rate_limit_per_minute, burst=settings.rate_limit_burst),
            principal=presented_key,
        )
    install_problem_handlers(app)
    install_domain_error_handler(app)
    document_problems(app)
    routers = (datasets, base_models, tokenizers, grants, invitations, jobs, tuning, generation, catalogue, health, ui)
    for module in routers:
        app.include_router(module.router)
    return app
