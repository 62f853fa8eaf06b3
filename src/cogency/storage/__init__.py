"""Where state lives: the ``Store`` contract, SQLite (default) and PostgreSQL backends."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from ..errors import UsageError
from .base import ConversationRecord, ForgetReceipt, SaveBatch, Store, TaskRecord
from .sqlite import SQLiteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore

ENV_VAR = "COGENCY_DB"


def default_db_path() -> Path:
    """``$COGENCY_DB`` if it is a path, else ``cogency.db`` in the user's data directory."""
    configured = os.environ.get(ENV_VAR)
    if configured and "://" not in configured:
        return Path(configured).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "cogency" / "cogency.db"


def open_store(url: str | os.PathLike[str] | None = None, **options: Any) -> Store:
    """A ready store for ``url``; nothing connects until first use.

    ``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``sqlite://:memory:``, a plain path,
    or ``postgresql://…``. ``None`` means ``$COGENCY_DB`` or the default file, whose
    directory is created if missing (a file given here must be in a directory that exists).
    ``options`` go to the store; ``read_only=True`` (both backends) opens without creating,
    migrating or writing anything. A SQLite store's durability is ``synchronous="normal"``
    (the default: survives the process crashing) or ``"full"`` (survives a power loss too),
    also given in the URL as ``sqlite:///agent.db?synchronous=full``.
    """
    default = url is None
    if url is None:
        url = os.environ.get(ENV_VAR) or default_db_path()
    text = os.fspath(url)
    if text.startswith(("postgresql://", "postgres://")):
        if "synchronous" in options:
            raise UsageError(
                "synchronous= is a SQLite setting; a PostgreSQL commit's durability is the "
                "server's synchronous_commit (on by default: every commit survives a power loss)"
            )
        from .postgres import PostgresStore

        return PostgresStore(text, **options)
    if default and not options.get("read_only"):
        options = {"create_dirs": True, **options}
    if text.startswith("sqlite:"):
        rest, options = _sqlite_url_options(text, options)
        if rest in ("", "//", "//:memory:", ":memory:", "///:memory:"):
            return SQLiteStore(":memory:", **options)
        if not rest.startswith("///"):
            raise UsageError(
                f"cannot read the SQLite URL {text!r}: use sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        return SQLiteStore(rest[3:], **options)
    if "://" in text:
        raise UsageError(
            f"unknown database URL {text!r}: use sqlite:///path.db, postgresql://…, or a file path"
        )
    if not text.strip():
        raise UsageError("the database path is empty: pass a file path or a URL")
    return SQLiteStore(text, **options)


def _sqlite_url_options(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The part of a ``sqlite:`` URL after the scheme, less its query, and the options with
    the query's (``?synchronous=full``) added."""
    rest, _, query = url[len("sqlite:"):].partition("?")
    if not query:
        return rest, options
    pairs = parse_qsl(query, keep_blank_values=True)
    unknown = sorted({key for key, _ in pairs} - {"synchronous"})
    if unknown or len(pairs) != 1:
        raise UsageError(
            f"cannot read the SQLite URL {url!r}: the only setting it takes is "
            "?synchronous=normal or ?synchronous=full"
        )
    value = pairs[0][1]
    if "synchronous" in options and options["synchronous"] != value:
        raise UsageError(
            f"the URL {url!r} says synchronous={value} but synchronous={options['synchronous']!r}"
            " was passed too: say it once"
        )
    return rest, {**options, "synchronous": value}


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":  # imported on use: its driver is an optional extra
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(name)


__all__ = [
    "ConversationRecord",
    "ForgetReceipt",
    "PostgresStore",
    "SQLiteStore",
    "SaveBatch",
    "Store",
    "TaskRecord",
    "default_db_path",
    "open_store",
]
