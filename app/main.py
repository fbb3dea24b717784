"""The FastAPI application factory."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import (
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
from app.api.docs_pages import install_docs_pages
from app.api.domain_errors import install_domain_error_handler
from app.api.ui_session import session_secret
from app.bootstrap import register_bootstrap_key
from app.config import Settings, get_settings
from app.problems import document_problems, install_problem_handlers
from app.rate_limit import RateLimiter, RateLimitMiddleware, principal_resolver
from app.reconciler import run_periodically
from app.services import JobDispatcher, Services, build_services


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
        docs_url=None,  # FastAPI's pages load from a CDN; app.api.docs_pages serves them locally
        redoc_url=None,
    )
    install_docs_pages(app)
    app.state.services = services
    if settings.rate_limit_per_minute > 0:
        app.add_middleware(
            RateLimitMiddleware,
            limiter=RateLimiter(per_minute=settings.rate_limit_per_minute, burst=settings.rate_limit_burst),
            principal=principal_resolver(
                secret=functools.cache(lambda: session_secret(settings)),
                max_age_s=settings.ui_session_max_age_s,
            ),
        )
    install_problem_handlers(app)
    install_domain_error_handler(app)
    document_problems(app)
    routers = (datasets, base_models, tokenizers, grants, invitations, jobs, tuning, generation, catalogue, health, ui)
    for module in routers:
        app.include_router(module.router)
    return app
