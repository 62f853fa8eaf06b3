"""``cogency serve`` and ``cogency keys``, registered on the main command's parser.

Nothing here imports the web stack until ``serve`` runs, so ``cogency keys`` and the rest of
the command line start fast and work without the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, UsageError


def add_commands(commands: Any, common: argparse.ArgumentParser,
                 agent: argparse.ArgumentParser) -> None:
    """Add ``serve`` and ``keys`` to the ``cogency`` subcommands (``agent``: the options that
    make the agent, as for ``cogency run``)."""
    serve = commands.add_parser(
        "serve", parents=[common, agent],
        help="serve the agent over HTTP to the users of API keys",
        description="Serve the agent over HTTP: a native API with live events (SSE) and "
                    "OpenAPI at /docs. Each API key acts as its user only. Run several "
                    "replicas on one PostgreSQL database to scale out.",
    )
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: %(default)s, this machine only)")
    serve.add_argument("--port", type=int, default=8000,
                       help="port (default: %(default)s; 0 picks a free one)")
    serve.add_argument("--no-memory", action="store_true",
                       help="do not learn a profile of each user (learning is on by default, "
                            "as for `cogency run`, unless the model is too small to learn)")
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="let browsers on this origin call the API (repeatable; "
                            "default: CORS off)")
    serve.add_argument("--max-body", type=int, default=1_000_000, metavar="BYTES",
                       help="largest request body (default: %(default)s)")
    serve.add_argument("--max-query", type=int, default=32_000, metavar="CHARS",
                       help="longest query (default: %(default)s)")
    serve.add_argument("--max-runs-per-key", type=int, default=4, metavar="N",
                       help="runs one key may have in flight per replica (default: %(default)s)")
    serve.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                       help="on SIGTERM, how long runs in flight may finish before they are "
                            "saved as resumable, the whole shutdown's budget (default: "
                            "%(default)s)")
    serve.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="a request's headers must arrive within this (default: "
                            "%(default)s); then 408")
    serve.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="a request's body must arrive within this after its headers "
                            "(default: %(default)s); then 408")
    serve.add_argument("--max-connections", type=int, default=1000, metavar="N",
                       help="connections held at once (default: %(default)s, at most what "
                            "the open-file limit allows); one more gets 503")
    serve.add_argument("--max-connections-per-client", type=int, default=100, metavar="N",
                       help="connections from one address at once (default: %(default)s; "
                            "raise it behind a proxy); one more gets 503")
    serve.add_argument("--metrics", action="store_true",
                       help="serve metrics in Prometheus text at /metrics (no key needed; no "
                            "label names a user; needs the otel extra)")
    serve.set_defaults(handler=_serve)

    keys = commands.add_parser("keys", help="create, list and revoke API keys of `serve`")
    actions = keys.add_subparsers(dest="action", metavar="ACTION", required=True,
                                  help="create, list or revoke")
    create = actions.add_parser("create", parents=[common],
                                help="make a key for a user (printed once, on the last line)")
    create.add_argument("--user", required=True, help="the user the key acts as")
    create.add_argument("--name", default="", help="a note to tell keys apart")
    create.set_defaults(handler=_keys_create)
    listing = actions.add_parser("list", parents=[common], help="list keys (never the keys)")
    listing.add_argument("--user", help="only this user's")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(handler=_keys_list)
    revoke = actions.add_parser("revoke", parents=[common], help="stop a key from working")
    revoke.add_argument("key_id", help="the id `keys list` shows (or the whole key)")
    revoke.set_defaults(handler=_keys_revoke)


# -- keys ---------------------------------------------------------------------------------------


async def _keys_create(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from ..storage import open_store
    from .keys import create_key

    store = open_store(args.db)
    try:
        record, key = await create_key(store, args.user, args.name)
    finally:
        await store.close()
    print(f"created key {record.key_id} for user {record.user_id!r}; it is shown only now, "
          "store it safely:", file=sys.stderr)
    print(key)
    return 0


async def _keys_list(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    import json

    from ..storage import open_store

    store = open_store(args.db)
    try:
        records = await store.list_api_keys(args.user)
    finally:
        await store.close()
    for record in records:
        state = "revoked" if record.revoked_at else "active"
        created = record.created_at.isoformat(timespec="seconds") if record.created_at else ""
        if args.json:
            print(json.dumps({"key_id": record.key_id, "user_id": record.user_id,
                              "name": record.name, "created_at": created, "state": state}))
        else:
            print(f"{record.key_id}  {record.user_id}  {state}  {created}  {record.name}")
    if not records and not args.json:
        print("no API keys (`cogency keys create --user USER` makes one)")
    return 0


async def _keys_revoke(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    from ..storage import open_store
    from .keys import key_id_of

    store = open_store(args.db)
    try:
        record = await store.revoke_api_key(key_id_of(args.key_id))
    finally:
        await store.close()
    print(f"revoked key {record.key_id} of user {record.user_id!r}")
    return 0


# -- serve --------------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace, progress: dict[str, Any]) -> int:
    try:
        from . import transport
        from .app import Settings, create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"`cogency serve` needs the web stack ({exc.name} is missing): "
            "pip install 'cogency[serve]'"
        ) from exc
    from ..agent import Agent
    from ..storage import open_store
    from ..tools.spec import builtin_tools, mcp_servers

    for name in ("grace", "header_timeout", "body_timeout"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number of seconds")
    for name in ("max_body", "max_query", "max_runs_per_key", "max_connections",
                 "max_connections_per_client"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Each user's tools work in a directory of their own under --root (made on first use).
    tools = [*builtin_tools(args.tools, Path(args.root or "."), read_only=args.read_only,
                            many_users=True),
             *mcp_servers(args.mcp, read_only=args.read_only)]
    store = open_store(args.db)
    try:
        await store.list_api_keys()  # reach (and migrate) the database before listening
        agent = Agent(llm=args.llm, tools=tools, store=store, memory=not args.no_memory,
                      max_iterations=args.max_iterations, approve=True if args.yes else None,
                      root_per_user=True)
        async with agent:
            start = getattr(agent.llm, "start", None)
            if start is not None:  # the offline model: load it before taking requests
                await start()
            settings = Settings(
                max_body=args.max_body, max_query=args.max_query,
                max_runs_per_key=args.max_runs_per_key,
                cors_origins=tuple(args.cors_origin), grace=args.grace,
                header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                max_connections=_connection_cap(args.max_connections),
                max_connections_per_client=args.max_connections_per_client,
            )
            app = create_app(agent, settings, metrics=getattr(
                getattr(args, "telemetry", None), "registry", None))
            listener = _listen(args.host, args.port, transport.BACKLOG)
            host, port = listener.getsockname()[:2]
            print(f"cogency serve: listening on http://{_url_host(host)}:{port} "
                  f"(model {agent.llm.name}, database {_where(store)}); API docs at /docs",
                  flush=True)
            await transport.serve(app, settings, listener,
                                  drain=lambda: app.state.runs.shutdown(settings.grace))
    finally:
        await store.close()
    return 0


SPARE_FILES = 512
"""File descriptors kept free of connections: for the database, the model, tools, and the
connections accepted in a burst before the cap turns them away."""


def _connection_cap(wanted: int) -> int:
    """``wanted``, or fewer when the open-file limit would run out first (each connection is
    a file descriptor); the soft limit is raised to the hard one when that is needed."""
    try:
        import resource
    except ImportError:  # not POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted + SPARE_FILES:
        target = hard if hard == resource.RLIM_INFINITY else min(hard, wanted + SPARE_FILES)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted + SPARE_FILES:
        return wanted
    cap = max(soft - SPARE_FILES, 16)
    logging.getLogger("cogency.server").warning(
        "the open-file limit (%d) allows %d connections, not --max-connections %d", soft, cap,
        wanted)
    return cap


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket, bound before the server starts so a taken port is a clear error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {host!r}: {exc.strerror}; pass --host an address "
                         "of this machine") from exc
    family, kind, proto, _, address = infos[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(backlog)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is in use by another program; "
                             "pick another with --port") from exc
        raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror})") from exc
    listener.set_inheritable(True)
    return listener


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _where(store: Any) -> str:
    from ..storage.postgres import redact

    dsn = getattr(store, "dsn", None)
    return redact(dsn) if dsn else str(getattr(store, "path", store))
