"""Starting a serving process for the ``tether`` CLI: the migrations, uvicorn, the process's
garbage collection, and the store the CLI's other commands open.

A process keeps every module it imports, so what only some starts need stays out of the
serving process: the migrations run in a forked child (:func:`start_migrations`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import click

from . import __version__
from .agent import Agent

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from .server._worker_metrics import WorkerMetrics

__all__ = [
    "KEEP_ALIVE_S",
    "GC_YOUNG_THRESHOLD",
    "default_workers",
    "log_config",
    "migrate",
    "serve_agent",
    "shown_url",
    "start_migrations",
    "tune_gc",
    "with_store",
]

#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_S = 5


def serve_agent(
    agent: Agent,
    *,
    host: str,
    port: int,
    db: str,
    log_level: str,
    lease_seconds: float,
    max_connections: int,
    auth: Literal["open", "keys"],
    four_eyes: Literal["off", "destructive"],
    drain_s: float,
    cors_origins: Sequence[str],
    limits: dict[str, Any],
    workers: int | None = 1,
    webhooks: Any = None,
) -> None:
    """Serve ``agent`` on ``host:port`` with the database ``db`` until told to stop: the
    migrations first (:func:`start_migrations`), then uvicorn on uvloop; with ``workers``
    above 1 (None: :func:`default_workers`), that many processes sharing the port
    (:mod:`tether._workers`)."""
    count = default_workers(db) if workers is None else workers
    if count > 1:
        from . import _workers

        if not db.startswith("postgresql"):
            raise click.BadParameter(_workers.SQLITE_REFUSAL, param_hint="--workers")
        migrating = start_migrations(db)
        if migrating is not None:
            migrating.join()
            if migrating.exitcode != 0:
                raise click.ClickException("the database's migrations failed (their error is above)")

        from .server._worker_metrics import WorkerMetrics

        shared = WorkerMetrics.create()  # every worker's counts, for one /metrics of the server

        def one_worker(sockets: list[Any], ready: Callable[[], None]) -> None:
            _serve(
                agent,
                sockets,
                on_started=ready,
                shared_metrics=shared,
                host=host,
                port=port,
                db=db,
                log_level=log_level,
                lease_seconds=lease_seconds,
                max_connections=max_connections,
                auth=auth,
                four_eyes=four_eyes,
                drain_s=drain_s,
                cors_origins=cors_origins,
                limits=limits,
                webhooks=webhooks,
            )

        bound = _workers.bind(host, port)
        click.echo(
            f"Tether {__version__}: serving agent {agent.name!r} on http://{host}:{bound.getsockname()[1]} with {count} worker processes (db: {shown_url(db)}, auth: {auth})",
            err=True,
        )
        try:
            code = _workers.supervise(count, bound, one_worker, ended=shared.worker_ended)
        finally:
            shared.remove()
        raise SystemExit(code)
    migrating = start_migrations(db)
    _serve(
        agent,
        None,
        host=host,
        port=port,
        db=db,
        log_level=log_level,
        lease_seconds=lease_seconds,
        max_connections=max_connections,
        auth=auth,
        four_eyes=four_eyes,
        drain_s=drain_s,
        cors_origins=cors_origins,
        limits=limits,
        migrating=migrating,
        webhooks=webhooks,
    )


def default_workers(db: str) -> int:
    """``--workers`` when it is not given: the cores this process may run on with PostgreSQL,
    1 with SQLite (whose store serves one process only: :data:`tether._workers.SQLITE_REFUSAL`)."""
    import os

    if not db.startswith("postgresql"):
        return 1
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _serve(
    agent: Agent,
    sockets: list[Any] | None,
    *,
    host: str,
    port: int,
    db: str,
    log_level: str,
    lease_seconds: float,
    max_connections: int,
    auth: Literal["open", "keys"],
    four_eyes: Literal["off", "destructive"],
    drain_s: float,
    cors_origins: Sequence[str],
    limits: dict[str, Any],
    migrating: BaseProcess | None = None,
    webhooks: Any = None,
    on_started: Callable[[], None] | None = None,
    shared_metrics: WorkerMetrics | None = None,
) -> None:
    """One serving process: on ``sockets`` (a worker's, bound by its supervisor, told that it
    serves through ``on_started``, its counts summed with the other workers' in
    ``shared_metrics``) or on ``host:port``."""
    import uvicorn

    from .server import Limits, create_app
    from .server._serving import StreamEndingServer, serve

    app = create_app(
        agent, db, lease_s=lease_seconds, drain_s=drain_s, auth=auth, four_eyes=four_eyes, cors_origins=cors_origins, limits=Limits(**limits), webhooks=webhooks
    )
    if shared_metrics is not None:
        from .server._worker_metrics import share_counts

        share_counts(app, shared_metrics)
    if migrating is not None:
        migrating.join()
        if migrating.exitcode != 0:
            raise click.ClickException("the database's migrations failed (their error is above)")
    if sockets is None:
        click.echo(f"Tether {__version__}: serving agent {agent.name!r} on http://{host}:{port} (db: {shown_url(db)}, auth: {auth})", err=True)
    tune_gc()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config(),
        timeout_graceful_shutdown=3,
        limit_concurrency=max_connections,
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=2048,
        ws="none",  # no WebSocket routes: the WebSocket implementation is never loaded
        loop="tether.server._loop:new_event_loop",  # uvloop, accepting a burst of connections at once
    )

    if sockets is None:
        serve(app, config)  # ends the open streams as soon as it is told to stop
        return
    server = StreamEndingServer(config, app, on_started=on_started)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    if not server.started:
        raise SystemExit(3)


def log_config() -> dict[str, Any]:
    """uvicorn's logging, plus Tether's own loggers with their level in every line (so an
    ``ERROR`` in a server log is always findable)."""
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = {**LOGGING_CONFIG, "formatters": dict(LOGGING_CONFIG["formatters"]), "handlers": dict(LOGGING_CONFIG["handlers"])}
    config["formatters"]["tether"] = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    config["handlers"]["tether"] = {"formatter": "tether", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    config["loggers"] = {**LOGGING_CONFIG["loggers"], "tether": {"handlers": ["tether"], "level": "INFO", "propagate": False}}
    return config


def shown_url(db: str) -> str:
    """A database URL as the CLI prints it: with its password masked."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(db).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: the store refuses it with its own error
        return "<database URL>"


def start_migrations(db: str) -> BaseProcess | None:
    """Migrate the schema at ``db`` in a forked child process when it is not up to date.

    A process keeps every module it imports, and the migrations load Alembic, Mako, Pygments
    and SQLAlchemy's ORM (about 18 MiB) that serving never uses: in a child, the server never
    holds them. Forked, the child starts with what this process has imported already and
    migrates while the server imports the rest of itself. Where processes cannot be forked
    (Windows) this returns None and the store migrates in this process when it opens.
    """
    import asyncio
    import multiprocessing

    from .store import Store

    if "fork" not in multiprocessing.get_all_start_methods() or not asyncio.run(Store.needs_migrations(db)):
        return None
    child = multiprocessing.get_context("fork").Process(target=migrate, args=(db,), name="tether-migrate")
    child.start()
    return child


def migrate(db: str) -> None:
    """Open a store on ``db``, which brings its schema up to date, and say so."""
    from .store._engine import HEAD_REVISION

    async def nothing(_store: Any) -> None:
        return None

    with_store(db, nothing)
    click.echo(f"Tether {__version__}: the schema of {shown_url(db)} is up to date (revision {HEAD_REVISION})", err=True)


#: Allocations between two collections of the garbage collector's youngest generation (CPython's
#: default is 700).
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Garbage collection for a long-running server, set once by the process that serves.

    A streaming server allocates a few objects per event, so CPython's defaults collect the
    young generation hundreds of times a second and now and then walk every object, the
    libraries' included: in the 500-run benchmark that was 0.85 s of collection in 8 s and
    pauses of up to 165 ms (every stream stalls during one). The objects made at start-up
    (modules, the app, SQLAlchemy's tables) live as long as the process: frozen, no
    collection looks at them again. The young generation is collected every
    :data:`GC_YOUNG_THRESHOLD` allocations instead of 700. Measured: 0.05 s of collection,
    longest pause 13 ms. Reference cycles are still collected, only less often.
    """
    import gc

    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, gen1, gen2)


def with_store(db: str, action: Callable[[Any], Any]) -> Any:
    """Run ``action(store)`` on a store opened on ``db`` (migrated), in an event loop of its own."""
    import asyncio

    from .store import Store

    async def run() -> Any:
        store = await Store.open(db)
        try:
            return await action(store)
        finally:
            await store.aclose()

    return asyncio.run(run())
