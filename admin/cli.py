"""``privtrain-admin``: run the embedded service, migrate, manage keys, run a worker."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from sqlalchemy import select

from admin.key_banner import print_start_banner
from kernel.access.keys import (
    DEFAULT_TENANT,
    find_api_keys,
    generate_api_key,
    get_or_create_tenant,
    register_api_key,
    revoke_api_key,
)
from kernel.bootstrap import ensure_embedded_key, migrate, migration_head, register_bootstrap_key
from kernel.config import Settings, get_settings
from kernel.db.engine import Database, is_sqlite
from kernel.db.orm import ApiKey, Tenant
from kernel.logging_setup import configure_logging
from kernel.parent_death import PARENT_PID_ENV, die_with_parent
from kernel.services import CeleryDispatcher
from kernel.storage.configured import blob_store_from_settings

WORKER_STOP_TIMEOUT_S = 15
EXIT_NO_DATABASE = 3
"""Exit status of an admin command that found no usable database (argparse's usage errors are 2)."""


def worker_command(queues: str, *, loglevel: str = "INFO") -> list[str]:
    """One worker process, one task at a time (one process per GPU in production)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.entry",
        "worker",
        "--pool=solo",
        "--concurrency=1",
        "-Q",
        queues,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        f"--loglevel={loglevel}",
    ]


def _shown_url(url: str) -> str:
    """The database URL as it may be printed: without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(an unparseable URL)"


def _no_database_message(settings: Settings, *, command: str, reason: str) -> str:
    """Say where the command looked and how to point it elsewhere (instead of a traceback)."""
    data_dir_source = (
        "from PRIVTRAIN_DATA_DIR"
        if "PRIVTRAIN_DATA_DIR" in os.environ
        else f"the default: .privtrain in the current directory, {os.getcwd()}"
    )
    database_source = (
        "from PRIVTRAIN_DATABASE_URL" if settings.database_url else "the default: privtrain.db in the data directory"
    )
    return "\n".join(
        [
            f"privtrain-admin {command}: {reason}",
            f"  data directory: {settings.data_dir.resolve()}  ({data_dir_source})",
            f"  database:       {_shown_url(settings.resolved_database_url)}  ({database_source})",
            "Run it where the service's .privtrain directory is (where `make run` or `privtrain-admin "
            "serve` ran), or point to it:",
            f"  PRIVTRAIN_DATA_DIR=/path/to/.privtrain privtrain-admin {command} …",
            f"  PRIVTRAIN_DATABASE_URL=postgresql+psycopg://user@host/db privtrain-admin {command} …",
            "(`privtrain-admin migrate` creates a new, empty database with the same settings.)",
        ]
    )


def database_problem(settings: Settings) -> str | None:
    """Why the admin commands cannot use the configured database, or None when they can.

    Checked before connecting, so a SQLite file that does not exist is not created as a side
    effect, and a database that exists but was never migrated is named as such.
    """
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    url = settings.resolved_database_url
    if is_sqlite(url):
        path = make_url(url).database
        if path and path != ":memory:" and not os.path.exists(path):
            return "there is no privtrain database here (the database file does not exist)"
    db = Database(url)
    try:
        with db.engine.connect() as connection:
            revision = MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None)  # the driver's error, on a DBAPIError
        first_line = str(cause if cause is not None else exc).splitlines()[0]
        return f"cannot open the database ({first_line})"
    finally:
        db.dispose()
    head = migration_head()
    if revision is None:
        return "the database exists but holds no privtrain tables (it was never migrated)"
    if revision != head:
        return (
            f"the database is at migration {revision}, this version needs {head}: run "
            "`privtrain-admin migrate` with the same settings first"
        )
    return None


def cmd_migrate(_args: argparse.Namespace) -> int:
    settings = get_settings()
    migrate(settings)
    print("database at head")
    return 0


def cmd_create_key(args: argparse.Namespace) -> int:
    settings = get_settings()
    db = Database(settings.resolved_database_url)
    key = generate_api_key()
    with db.write_transaction() as session:
        tenant = get_or_create_tenant(session, args.tenant)
        register_api_key(session, tenant=tenant, key=key, label=args.label)
    print(key)
    return 0


def cmd_list_keys(args: argparse.Namespace) -> int:
    """Key ids, prefixes and states (never the keys: only their digests are stored)."""
    db = Database(get_settings().resolved_database_url)
    with db.read_session() as session:
        query = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
        if args.tenant:
            query = query.where(Tenant.name == args.tenant)
        rows = session.execute(query.order_by(ApiKey.created_at)).all()
    db.dispose()
    for key, tenant in rows:
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        print(f"{key.id}  {key.prefix}…  tenant={tenant}  label={key.label!r}  {state}")
    return 0


def cmd_revoke_key(args: argparse.Namespace) -> int:
    """Revoke one key, named by id, by the key itself or by its unique 8-character prefix."""
    db = Database(get_settings().resolved_database_url)
    try:
        with db.write_transaction() as session:
            keys = find_api_keys(session, args.key)
            if not keys:
                print("no such API key", file=sys.stderr)
                return 1
            if len(keys) > 1:
                print(f"{len(keys)} keys share this prefix; name one by id (see list-keys)", file=sys.stderr)
                return 2
            key = keys[0]
            revoked = revoke_api_key(session, key)
            key_id = key.id
    finally:
        db.dispose()
    print(f"revoked {key_id}" if revoked else f"{key_id} was already revoked")
    return 0


def cmd_verify_ledger(args: argparse.Namespace) -> int:
    """Recompute every total, curve and hash from the entries; non-zero exit on any mismatch."""
    # heavy: the privacy maths (scipy) load only when this command runs
    from kernel.ledger.audit import format_report, verify_ledger

    db = Database(get_settings().resolved_database_url)
    report = verify_ledger(db, dataset_id=args.dataset)
    print(format_report(report))
    db.dispose()
    return 0 if report.ok else 1


def cmd_content_digests(_args: argparse.Namespace) -> int:
    """Compute the content digest of datasets registered before digests existed."""
    # heavy: the ingest (numpy, Pillow) loads only when this command runs
    from kernel.datasets.content_backfill import backfill_content_digests
    from kernel.ingest.limits import IngestLimits

    settings = get_settings()
    db = Database(settings.resolved_database_url)
    try:
        result = backfill_content_digests(
            db, blob_store_from_settings(settings), limits=IngestLimits.from_settings(settings)
        )
    finally:
        db.dispose()
    print(f"content digests computed for {len(result.computed)} dataset(s)")
    for dataset_id in result.unreadable:
        print(f"{dataset_id}: its stored upload cannot be read; it stays identified by its bytes' SHA-256")
    for group in result.same_rows:
        print(
            f"same rows, one tenant, separate budgets (registered before content digests): {', '.join(group)}; "
            "tell the owner: keep one and delete the others, or account for them together"
        )
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Settle jobs whose worker vanished and re-send lost messages, once or every interval."""
    import threading

    # heavy: the reconciler's reports (scipy, jinja2) load only when this command runs
    from kernel.reconciler import reconcile_once, run_periodically

    settings = get_settings()
    configure_logging(settings.log_level)
    db = Database(settings.resolved_database_url)
    dispatcher = CeleryDispatcher(settings)
    if not args.loop:
        result = reconcile_once(db, settings, dispatcher)
        print(f"requeued {len(result.requeued)}, failed {len(result.failed)}, re-sent {len(result.redispatched)}")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        run_periodically(db, settings, dispatcher, stop)
    except KeyboardInterrupt:
        stop.set()
    return 0


def cmd_worker(_args: argparse.Namespace) -> int:
    settings = get_settings()
    settings.check_safe()
    os.execv(sys.executable, worker_command(settings.consumed_queues, loglevel=settings.log_level))
    return 0  # pragma: no cover - execv does not return


SIGTERM_EXIT = 128 + signal.SIGTERM


def _exit_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(SIGTERM_EXIT)


def _start_worker(queue: str, *, loglevel: str) -> subprocess.Popen[bytes]:
    """serve's worker child, tied to this process: it gets SIGTERM when serve dies, even by SIGKILL
    (prctl where available, plus its own watch of the parent pid), so no worker is orphaned."""
    return subprocess.Popen(
        worker_command(queue, loglevel=loglevel),
        start_new_session=True,  # Ctrl-C reaches the API; we stop the worker ourselves
        env={**os.environ, PARENT_PID_ENV: str(os.getpid())},
        preexec_fn=die_with_parent(),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Embedded mode: migrations, the bootstrap key, one worker process, then the API."""
    import uvicorn

    # heavy: the web application (FastAPI and every route) loads only where serve runs it
    from api.main import create_app

    settings = get_settings()
    configure_logging(settings.log_level)
    settings.check_safe()
    migrate(settings)
    db = Database(settings.resolved_database_url)
    key, key_file = None, None
    if settings.bootstrap_api_key:
        register_bootstrap_key(db, settings.bootstrap_api_key)
    else:
        key, key_file = ensure_embedded_key(settings, db)
    db.dispose()
    worker = None
    if not args.no_worker:
        worker = _start_worker(settings.consumed_queues, loglevel=settings.log_level)
    host = args.host if args.host is not None else settings.host
    port = args.port if args.port is not None else settings.port
    print_start_banner(sys.stderr, url=f"http://{host}:{port}", key=key, key_file=key_file)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler that was
    # installed before it started. With the default handler that kills this process before the
    # `finally` below can stop the worker; this handler turns it into an exception instead.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run(create_app(settings), host=host, port=port, log_config=None)
    except SystemExit as exc:
        if exc.code != SIGTERM_EXIT:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=WORKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privtrain-admin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the API and one worker (embedded mode)")
    serve.add_argument(
        "--host", default=None, help="address to listen on (default: PRIVTRAIN_HOST, else 127.0.0.1; 0.0.0.0: all)"
    )
    serve.add_argument("--port", type=int, default=None, help="port to listen on (default: PRIVTRAIN_PORT, else 8000)")
    serve.add_argument("--no-worker", action="store_true", help="API only (distributed mode)")
    serve.set_defaults(func=cmd_serve)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)
    key = sub.add_parser("create-key", help="create an API key and print it once")
    key.add_argument("--tenant", default=DEFAULT_TENANT)
    key.add_argument("--label", default="")
    key.set_defaults(func=cmd_create_key, needs_database=True)
    revoke = sub.add_parser("revoke-key", help="revoke an API key (it then answers 401 like an unknown key)")
    revoke.add_argument("key", help="the key's id (key_…), the key itself, or its 8-character prefix")
    revoke.set_defaults(func=cmd_revoke_key, needs_database=True)
    keys = sub.add_parser("list-keys", help="list API keys: id, prefix, tenant, label, state")
    keys.add_argument("--tenant", default=None)
    keys.set_defaults(func=cmd_list_keys, needs_database=True)
    sub.add_parser("worker", help="run one Celery worker process").set_defaults(func=cmd_worker)
    verify = sub.add_parser("verify-ledger", help="audit the privacy ledger; exit 1 on any mismatch")
    verify.add_argument("--dataset", default=None, help="one dataset id (default: all)")
    verify.set_defaults(func=cmd_verify_ledger, needs_database=True)
    digests = sub.add_parser(
        "content-digests", help="compute the content digest of datasets registered before digests existed"
    )
    digests.set_defaults(func=cmd_content_digests, needs_database=True)
    reconcile = sub.add_parser("reconcile", help="settle lost jobs and re-send lost messages")
    reconcile.add_argument("--loop", action="store_true", help="repeat every PRIVTRAIN_RECONCILE_INTERVAL_S")
    reconcile.set_defaults(func=cmd_reconcile, needs_database=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "needs_database", False):
        return int(args.func(args))
    from sqlalchemy.exc import OperationalError, ProgrammingError

    settings = get_settings()
    reason = database_problem(settings)
    if reason is None:
        try:
            return int(args.func(args))
        except (OperationalError, ProgrammingError) as exc:  # e.g. the database went away mid-way
            reason = f"the database failed ({str(exc.orig or exc).splitlines()[0]})"
    print(_no_database_message(settings, command=args.command, reason=reason), file=sys.stderr)
    return EXIT_NO_DATABASE


if __name__ == "__main__":
    sys.exit(main())
