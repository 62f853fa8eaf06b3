"""File tools confined to one root directory: read, write, edit, list, search.

Every path is walked from the root one component at a time with ``openat``-style calls
(``dir_fd``, ``O_NOFOLLOW``), so a symlink swapped in between a check and its use makes the
call fail instead of leaving the root. Symlinks whose target stays inside the root are
followed (by the walker, never by the kernel); ``..``, absolute paths, links that leave the
root, files with several hard links, and anything but regular files and directories are
refused with a message saying why. POSIX only.

``file_search`` walks without recursion (a depth limit, not the interpreter's stack, bounds
it) and matches with the ``regex`` package under a time limit per line, releasing the GIL: a
pattern that backtracks without end is stopped and reported, never left holding the process.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import regex as _regex

from ..errors import ConfigurationError, ToolError
from .base import Tool

MAX_READ_BYTES = 256_000
MAX_WRITE_BYTES = 1_000_000
MAX_LIST_ENTRIES = 500
MAX_SEARCH_RESULTS = 100
MAX_SEARCH_FILES = 5_000
MAX_SEARCH_FILE_BYTES = 2_000_000
SEARCH_SECONDS = 10.0
MAX_SEARCH_DEPTH = 64
"""Directory levels ``file_search`` descends below its path; deeper ones are reported."""
SLOW_LINE_SECONDS = 1.0
"""A regular expression that needs longer for one line is "too slow" (it backtracks)."""
MAX_PATTERN_CHARS = 1_000
MAX_PATH_CHARS = 4_096
MAX_SYMLINK_HOPS = 40

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""``O_NONBLOCK``: a FIFO swapped in after the type check must not block the open."""


class _Root:
    """A directory the tools cannot leave; every method walks from it by file descriptor."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise ConfigurationError(
                f"file tools root {str(path)!r} is not a directory; create it first"
            )
        self.path = os.path.realpath(path)

    # -- walking ---------------------------------------------------------------------------

    def _open_root(self) -> int:
        return os.open(self.path, _DIR_FLAGS)

    def _split(self, rel: Any) -> list[str]:
        if not isinstance(rel, str):
            raise ToolError("path must be a string relative to the root")
        if "\x00" in rel:
            raise ToolError("path contains a NUL byte")
        if len(rel) > MAX_PATH_CHARS:
            raise ToolError(f"path is longer than {MAX_PATH_CHARS} characters")
        if rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
            raise ToolError(
                f"{rel!r} is an absolute path; paths are relative to the root, e.g. 'src/main.py'"
            )
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ToolError(f"{rel!r} contains '..'; paths may not leave the root")
        return parts

    def walk(self, rel: str, *, create_dirs: bool = False) -> tuple[list[int], str | None, str]:
        """Open the directories down to the last component of ``rel``.

        Returns the open directory fds (root first; the caller closes them with
        :meth:`close`), the final name (``None`` when ``rel`` names the root) and the path
        actually reached, relative to the root, for messages. Symlinks are followed by
        reading them; their targets must stay inside the root.
        """
        parts = deque(self._split(rel))
        stack = [self._open_root()]
        names: list[str] = []
        hops = 0
        try:
            while parts:
                name = parts.popleft()
                if name in ("", "."):
                    continue
                if name == "..":  # only from a symlink's target
                    if len(stack) == 1:
                        raise ToolError(f"{rel!r} leads through a symlink out of the root; refused")
                    os.close(stack.pop())
                    names.pop()
                    continue
                last = not parts
                try:
                    info = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return stack, name, "/".join([*names, name])
                    if not create_dirs:
                        missing = "/".join([*names, name])
                        raise ToolError(f"no directory {missing!r} under the root") from None
                    try:
                        os.mkdir(name, 0o755, dir_fd=stack[-1])
                    except FileExistsError:
                        pass
                    info = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise ToolError(f"{rel!r}: too many levels of symbolic links")
                    target = os.readlink(name, dir_fd=stack[-1])
                    parts.extendleft(reversed(self._link_parts(target, rel, stack, names)))
                    continue
                if last:
                    return stack, name, "/".join([*names, name])
                if not stat.S_ISDIR(info.st_mode):
                    raise ToolError(f"{'/'.join([*names, name])!r} is not a directory")
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=stack[-1])
                except OSError as exc:
                    raise _changed(rel, exc) from exc
                stack.append(fd)
                names.append(name)
            return stack, None, "/".join(names) or "."
        except BaseException:
            self.close(stack)
            raise

    def _link_parts(self, target: str, rel: str, stack: list[int], names: list[str]) -> list[str]:
        if not target.startswith("/"):
            return target.split("/")
        # An absolute target is followed only when it names a place under the root.
        if target != self.path and not target.startswith(self.path.rstrip("/") + "/"):
            raise ToolError(f"{rel!r} is a symlink to {target!r}, outside the root; refused")
        while len(stack) > 1:
            os.close(stack.pop())
        names.clear()
        return target[len(self.path):].split("/")

    @staticmethod
    def close(fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)

    def open_file(
        self, rel: str, *, max_bytes: int | None = None
    ) -> tuple[int, os.stat_result, str]:
        """An fd of the regular, singly linked file ``rel`` (read-only) with its fstat."""
        stack, name, shown = self.walk(rel)
        try:
            if name is None:
                raise ToolError("the root is a directory, not a file; use file_list")
            try:
                # Say what a special file is before opening it (a socket cannot be opened);
                # the fstat below checks again what was actually opened.
                _check_regular(os.stat(name, dir_fd=stack[-1], follow_symlinks=False), shown)
                fd = os.open(name, _FILE_FLAGS, dir_fd=stack[-1])
            except FileNotFoundError:
                raise ToolError(
                    f"no file {shown!r} under the root (file_list shows what exists)"
                ) from None
            except OSError as exc:
                raise _changed(rel, exc) from exc
        finally:
            self.close(stack)
        try:
            info = os.fstat(fd)
            _check_regular(info, shown)
            if max_bytes is not None and info.st_size > max_bytes:
                raise ToolError(
                    f"{shown!r} is {info.st_size} bytes, over the {max_bytes}-byte read limit; "
                    "read it in parts with start_line/max_lines or use file_search"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, info, shown

    def write_file(self, rel: str, data: bytes) -> str:
        """Replace or create ``rel`` atomically (temporary file + rename in the same directory)."""
        stack, name, shown = self.walk(rel, create_dirs=True)
        try:
            if name is None:
                raise ToolError("cannot write to the root directory itself; name a file")
            parent = stack[-1]
            mode = 0o644
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                info = None
            if info is not None:
                _check_regular(info, shown)
                # Permissions carry over, set-user/group-id never: new content is not the
                # program the owner made privileged.
                mode = stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
            temp = f".{name[:100]}.{uuid.uuid4().hex[:12]}.tmp"
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode, dir_fd=parent,
            )
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                # rename replaces the directory entry itself: a symlink or hard link swapped
                # in meanwhile is replaced, never written through.
                os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                try:
                    os.unlink(temp, dir_fd=parent)
                except FileNotFoundError:
                    pass
                raise
            return shown
        finally:
            self.close(stack)


def _check_regular(info: os.stat_result, shown: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{shown!r} is a directory; use file_list")
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
            else "a FIFO" if stat.S_ISFIFO(info.st_mode)
            else "a socket" if stat.S_ISSOCK(info.st_mode)
            else "a symlink" if stat.S_ISLNK(info.st_mode)
            else "not a regular file"
        )
        raise ToolError(f"{shown!r} is {kind}; only regular files can be read or written")
    if info.st_nlink > 1:
        raise ToolError(
            f"{shown!r} has {info.st_nlink} hard links; another link may be outside the root, "
            "so it is refused (copy it to a new file outside the tools to use it)"
        )


def _changed(rel: str, exc: OSError) -> ToolError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return ToolError(
            f"{rel!r} changed into a symlink or another kind of file while it was opened; refused"
        )
    return ToolError(f"cannot open {rel!r}: {exc.strerror or exc}")


def _read_all(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total <= limit:
        chunk = os.read(fd, min(65_536, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise ToolError(f"the file grew past the {limit}-byte read limit while it was read")
    return b"".join(chunks)


def files_tools(
    root: str | os.PathLike[str],
    *,
    max_read_bytes: int = MAX_READ_BYTES,
    max_write_bytes: int = MAX_WRITE_BYTES,
    max_results: int = MAX_SEARCH_RESULTS,
    read_only: bool = False,
) -> list[Tool]:
    """The file tools, confined to ``root``: file_read, file_list, file_search, and unless
    ``read_only``, file_write and file_edit (which need a person's approval by default)."""
    jail = _Root(root)

    def file_read(path: str, start_line: int = 1, max_lines: int = 0) -> str:
        fd, _, shown = jail.open_file(path, max_bytes=max_read_bytes)
        try:
            text = _read_all(fd, max_read_bytes).decode("utf-8", "replace")
        finally:
            os.close(fd)
        if start_line > 1 or max_lines > 0:
            lines = text.splitlines(keepends=True)
            begin = max(start_line, 1) - 1
            end = begin + max_lines if max_lines > 0 else len(lines)
            text = "".join(lines[begin:end])
        return text

    def file_write(path: str, content: str) -> str:
        data = content.encode("utf-8", "replace")
        if len(data) > max_write_bytes:
            raise ToolError(f"content is {len(data)} bytes, over the {max_write_bytes}-byte limit")
        shown = jail.write_file(path, data)
        return f"wrote {len(data)} bytes to {shown}"

    def file_edit(path: str, old: str, new: str) -> str:
        if not old:
            raise ToolError("old must be a non-empty snippet of the file")
        fd, _, shown = jail.open_file(path, max_bytes=max_read_bytes)
        try:
            text = _read_all(fd, max_read_bytes).decode("utf-8", "replace")
        finally:
            os.close(fd)
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"the snippet was not found in {shown!r}; read the file and copy it exactly"
            )
        if count > 1:
            raise ToolError(
                f"the snippet occurs {count} times in {shown!r}; include more surrounding text "
                "so it is unique"
            )
        data = text.replace(old, new, 1).encode("utf-8", "replace")
        if len(data) > max_write_bytes:
            raise ToolError(f"the edited file would be over the {max_write_bytes}-byte limit")
        jail.write_file(path, data)
        return f"edited {shown}: replaced 1 occurrence"

    def file_list(path: str = ".") -> str:
        stack, name, shown = jail.walk(path)
        try:
            if name is None:
                fd = os.dup(stack[-1])
            else:
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=stack[-1])
                except FileNotFoundError:
                    raise ToolError(f"no directory {shown!r} under the root") from None
                except OSError as exc:
                    if exc.errno == errno.ENOTDIR:
                        raise ToolError(f"{shown!r} is not a directory; use file_read") from exc
                    raise _changed(path, exc) from exc
        finally:
            jail.close(stack)
        lines = []
        try:
            with os.scandir(fd) as entries:
                items = sorted(entries, key=lambda e: e.name)
            for entry in items[:MAX_LIST_ENTRIES]:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    lines.append(f"{entry.name}/")
                elif stat.S_ISLNK(info.st_mode):
                    lines.append(f"{entry.name} -> (symlink)")
                elif stat.S_ISREG(info.st_mode):
                    lines.append(f"{entry.name} ({info.st_size} bytes)")
                else:
                    lines.append(f"{entry.name} (special file)")
            if len(items) > MAX_LIST_ENTRIES:
                lines.append(f"…[{len(items) - MAX_LIST_ENTRIES} more entries not shown]")
        finally:
            os.close(fd)
        return "\n".join(lines) if lines else f"{shown} is empty"

    def file_search(pattern: str, path: str = ".", regex: bool = False) -> str:
        if not pattern:
            raise ToolError("pattern must not be empty")
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ToolError(f"pattern is longer than {MAX_PATTERN_CHARS} characters")
        deadline = time.monotonic() + SEARCH_SECONDS
        matches = _matcher(pattern, regex, deadline)
        stack, name, shown = jail.walk(path)
        try:
            top = os.dup(stack[-1]) if name is None else os.open(name, _DIR_FLAGS, dir_fd=stack[-1])
        except OSError as exc:
            raise ToolError(f"{shown!r} is not a directory under the root") from exc
        finally:
            jail.close(stack)
        base = "" if shown == "." else shown + "/"
        hits: list[str] = []
        skipped = scanned = 0
        too_deep: list[str] = []
        stopped = ""
        walk = _walk(top, MAX_SEARCH_DEPTH, too_deep)
        try:
            for dirpath, dirfd, filenames in walk:
                for filename in filenames:
                    if len(hits) >= max_results or scanned >= MAX_SEARCH_FILES:
                        stopped = "result" if len(hits) >= max_results else "file"
                        break
                    if time.monotonic() > deadline:
                        stopped = "time"
                        break
                    rel = os.path.normpath(os.path.join(dirpath, filename))
                    try:
                        found = _search_file(dirfd, filename, matches)
                    except _TooSlow as exc:
                        if exc.at_deadline:
                            stopped = "time"
                            break
                        raise ToolError(
                            f"pattern too slow: matching one line of {base + rel!r} took over "
                            f"{SLOW_LINE_SECONDS:g}s, so the search was stopped. Simplify the "
                            "pattern: nested repetition such as (a+)+ or (a|aa)+ backtracks "
                            "without end; a plain substring (regex=false) is always fast"
                        ) from None
                    if found is None:
                        skipped += 1
                        continue
                    scanned += 1
                    for number, line in found:
                        hits.append(f"{base}{rel}:{number}: {line}")
                        if len(hits) >= max_results:
                            break
                if stopped:
                    break
        finally:
            walk.close()
            os.close(top)
        notes = []
        if stopped:
            notes.append(f"stopped at the {stopped} limit; narrow the path or pattern")
        if skipped:
            notes.append(f"{skipped} files skipped (special, hard-linked, or too large)")
        if too_deep:
            notes.append(
                f"error: {len(too_deep)} directories nested deeper than {MAX_SEARCH_DEPTH} "
                f"levels were not searched (the first: {base + too_deep[0]!r}); search from "
                "a deeper path to reach them"
            )
        body = "\n".join(hits) if hits else "no matches"
        return body + ("".join(f"\n[{note}]" for note in notes))

    read_tool = Tool(
        "file_read",
        f"Read a UTF-8 text file under the root (at most {max_read_bytes} bytes); "
        "start_line/max_lines select part of it.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "relative to the root"},
                "start_line": {"type": "integer", "default": 1},
                "max_lines": {"type": "integer", "default": 0, "description": "0 means all"},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        file_read,
        timeout=30,
    )
    write_tool = Tool(
        "file_write",
        "Create or replace a file under the root with the given content (parent folders are "
        "created).",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        file_write,
        timeout=30,
        needs_approval=True,  # it changes files
    )
    edit_tool = Tool(
        "file_edit",
        "Replace the one occurrence of the snippet old with new in a file under the root "
        "(fails if old occurs 0 or several times).",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string"},
                "new": {"type": "string"},
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
        file_edit,
        timeout=30,
        needs_approval=True,  # it changes files
    )
    list_tool = Tool(
        "file_list",
        "List a directory under the root (default: the root itself).",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "default": "."}},
            "required": [],
            "additionalProperties": False,
        },
        file_list,
        timeout=30,
    )
    search_tool = Tool(
        "file_search",
        f"Find lines containing pattern (a substring, or a Python regex with regex=true) in "
        f"the files under path; at most {max_results} matches, {MAX_SEARCH_DEPTH} directory "
        "levels, and 1s of matching per line.",
        {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "default": "."},
                "regex": {"type": "boolean", "default": False},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
        file_search,
        timeout=SEARCH_SECONDS + 5,
    )
    tools = [read_tool, list_tool, search_tool] if read_only else [
        read_tool, write_tool, edit_tool, list_tool, search_tool]
    options = {"max_read_bytes": max_read_bytes, "max_write_bytes": max_write_bytes,
               "max_results": max_results, "read_only": read_only}
    for item in tools:
        item.root = jail.path
        item.rebuild = functools.partial(_rebuilt, item.name, options)
    return tools


def _rebuilt(name: str, options: dict[str, Any], root: str) -> Tool:
    """The file tool ``name`` made again with ``options``, confined to ``root``."""
    return next(item for item in files_tools(root, **options) if item.name == name)


class _TooSlow(Exception):
    """A line took the pattern over its time (``at_deadline``: the whole search's time ran out)."""

    def __init__(self, at_deadline: bool) -> None:
        super().__init__()
        self.at_deadline = at_deadline


def _matcher(pattern: str, regex: bool, deadline: float) -> Callable[[str], bool]:
    """Whether a line matches; raises :class:`_TooSlow` when a regex takes too long."""
    if not regex:
        return lambda line: pattern in line
    try:
        compiled = _regex.compile(pattern)
    except (_regex.error, OverflowError, RecursionError) as exc:
        raise ToolError(f"invalid regular expression: {exc}") from exc

    def matches(line: str) -> bool:
        left = deadline - time.monotonic()
        budget = min(SLOW_LINE_SECONDS, left)
        if budget <= 0:
            raise _TooSlow(at_deadline=True)
        try:
            # concurrent=True releases the GIL while matching: the event loop runs meanwhile.
            return compiled.search(line, timeout=budget, concurrent=True) is not None
        except TimeoutError:
            raise _TooSlow(at_deadline=budget < SLOW_LINE_SECONDS) from None

    return matches


def _walk(
    top: int, max_depth: int, too_deep: list[str]
) -> Generator[tuple[str, int, list[str]], None, None]:
    """``(path, fd, file names)`` of each directory under the open directory ``top``, depth
    first in name order, with a stack instead of recursion (``os.fwalk`` recursed: a tree 1,200
    levels deep raised ``RecursionError``). Symlinks are never followed; directories deeper
    than ``max_depth`` are left out and their paths added to ``too_deep``. At most
    ``max_depth`` directory fds are open at once; ``top`` is left open.
    """
    stack: list[tuple[str, int, Iterator[str]]] = []
    rel, fd = ".", top
    try:
        while True:
            files, dirs = _entries(fd)
            yield rel, fd, files
            stack.append((rel, fd, iter(dirs)))
            while stack:
                parent, parent_fd, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    if parent_fd != top:
                        os.close(parent_fd)
                    continue
                child_rel = os.path.normpath(os.path.join(parent, child))
                if len(stack) > max_depth:
                    too_deep.append(child_rel)
                    continue
                try:  # O_NOFOLLOW: a directory swapped for a symlink since the scan is refused
                    fd = os.open(child, _DIR_FLAGS, dir_fd=parent_fd)
                except OSError:
                    continue
                rel = child_rel
                break
            else:
                return
    finally:
        for _, open_fd, _ in stack:
            if open_fd != top:
                os.close(open_fd)


def _entries(fd: int) -> tuple[list[str], list[str]]:
    """The sorted non-directory, non-symlink names and directory names in the directory ``fd``."""
    files: list[str] = []
    dirs: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_symlink():
                    continue  # not followed: what it points to is found under its own path
                (dirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
    except OSError:
        pass
    return sorted(files), sorted(dirs)


def _search_file(
    dirfd: int, filename: str, matches: Callable[[str], bool]
) -> list[tuple[int, str]] | None:
    try:
        fd = os.open(filename, _FILE_FLAGS, dir_fd=dirfd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        too_big = info.st_size > MAX_SEARCH_FILE_BYTES
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or too_big:
            return None
        text = _read_all(fd, MAX_SEARCH_FILE_BYTES).decode("utf-8", "replace")
    except (OSError, ToolError):
        return None
    finally:
        os.close(fd)
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if matches(line[:10_000]):
            found.append((number, line[:300]))
    return found
