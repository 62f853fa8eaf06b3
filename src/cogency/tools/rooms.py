"""A directory of each user's own under a tool's root, for an agent that serves many users
(``Agent(root_per_user=True)``, as ``cogency serve`` runs it).

A user's directory is named from their id: a readable part (the id's ASCII letters, digits,
``_`` and ``-``, every other run of characters one ``_``, at most 40) and 32 hex digits of the
SHA-256 of the exact id. Two ids never share a directory, however alike they read (``a/b`` and
``a_b``, ``alice`` and a look-alike), since the name ends with a fixed-length digest of the id
itself; and no id reaches a path outside the root, since ``/``, ``.``, NUL and every other
character outside that set never enter the name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..errors import ConfigurationError, StorageError
from .base import Tool

READABLE_CHARS = 40
"""The most characters of the id kept readable in its directory's name."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def directory_name(user_id: str) -> str:
    """The name of ``user_id``'s directory: ``alice-3f2a…`` (ASCII, at most 73 characters)."""
    readable = _UNSAFE.sub("_", user_id).strip("_-")[:READABLE_CHARS].strip("_-") or "user"
    digest = hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{readable}-{digest}"


def user_directory(root: str | os.PathLike[str], user_id: str) -> Path:
    """Where ``user_id``'s directory under ``root`` is (whether or not it exists yet)."""
    return Path(root) / directory_name(user_id)


def _ensure(path: Path) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the user's tool directory {str(path)!r} ({exc.strerror}); check "
            "that the tools' root exists and this process may write it"
        ) from exc
    if not stat.S_ISDIR(os.lstat(path).st_mode):  # never a symlink put there by someone
        raise ConfigurationError(
            f"{str(path)!r} (a user's tool directory) is not a directory; remove it"
        )


def remove_user_directory(root: str | os.PathLike[str], user_id: str) -> Path | None:
    """Delete ``user_id``'s directory under ``root`` with everything in it (symlinks inside
    are removed, never followed); the path it was at, or ``None`` if there was none."""
    path = user_directory(root, user_id)
    problem: OSError | None = None
    for _ in range(3):  # a run still writing into it may add entries while it goes
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                os.unlink(path)
                return path
            shutil.rmtree(path)
            return path
        except FileNotFoundError:
            return None
        except OSError as exc:
            problem = exc
    raise StorageError(
        f"could not delete the user's tool directory {str(path)!r} ({problem}); delete it by "
        "hand"
    )


def remove_user_directories(roots: Iterable[str | os.PathLike[str]], user_id: str
                            ) -> tuple[str | None, int]:
    """Delete ``user_id``'s directory under each of ``roots``: the paths deleted (joined by
    ``os.pathsep``; ``None``: there was none) and how many files and directories they held
    (what a forget's receipt says of them)."""
    paths, held = [], 0
    for root in roots:
        path = user_directory(root, user_id)
        count = _entries(path)
        if remove_user_directory(root, user_id) is not None:
            paths.append(str(path))
            held += count
    return (os.pathsep.join(paths) or None), held


def _entries(path: Path) -> int:
    """Files and directories under ``path`` (symlinks counted, never followed)."""
    try:
        return sum(len(dirs) + len(files) for _, dirs, files in os.walk(path))
    except OSError:
        return 0


class Rooms:
    """An agent's tools, each confined to the running user's own directory under its root
    (tools without a root are shared as they are). ``prepare`` is called with each user's
    rebuilt tools once (the agent hides its store's files from them)."""

    def __init__(self, tools: Mapping[str, Tool], prepare: Callable[[Iterable[Tool]], None],
                 size: int = 256) -> None:
        self._tools = dict(tools)
        self._prepare = prepare
        self._size = size
        self.roots = sorted({item.root for item in self._tools.values()
                             if item.root is not None and item.rebuild is not None})
        self._cache: OrderedDict[str, dict[str, Tool]] = OrderedDict()

    def tools(self, user_id: str) -> dict[str, Tool]:
        """The tools for a run of ``user_id``, their directories created if missing (also
        after a forget, in this process or another)."""
        for root in self.roots:
            _ensure(user_directory(root, user_id))
        tools = self._cache.get(user_id)
        if tools is None:
            tools = {
                name: item.confined_to(str(user_directory(item.root, user_id)))
                if item.root is not None else item
                for name, item in self._tools.items()
            }
            self._prepare(tools.values())
            self._cache[user_id] = tools
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(user_id)
        return tools

    def forget(self, user_id: str) -> None:
        """Drop the user's tools (their directories are deleted by
        :func:`remove_user_directories`, under :attr:`roots`)."""
        self._cache.pop(user_id, None)
