"""A shell tool: one command in the root directory, with a time limit, an output cap, and an
environment built from an allow-list; inside a bubblewrap sandbox where the machine has a
working ``bwrap``.

The sandbox is built up from nothing: the root (read-write), a read-only minimal system
(``/usr`` and its links, the parts of ``/etc`` programs read), a private ``/tmp``, a minimal
``/dev`` and its own ``/proc``; no network, its own process tree, no capabilities. Nothing else is there: no
``/run`` or ``/var/run`` (so no Unix sockets of the machine's services), no home directories,
and never the files of the agent's store, even inside the root.

Every process a command starts is killed at its end, time-out or cancellation: in the sandbox
by ending its PID namespace; without it by walking ``/proc`` for the command's descendants,
its session, its process group and the processes that inherited its run marker (where there
is no ``/proc``, only its process group).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from ..errors import ConfigurationError, ToolError
from .base import Tool, in_thread

SHELL_TIMEOUT = 30.0
MAX_SHELL_OUTPUT = 64_000
"""Bytes of combined stdout/stderr kept; a command that writes more is stopped."""

UNSANDBOXED_NOTE = (
    "NOT sandboxed (bubblewrap is not available here): the command can reach the network, "
    "read and write whatever this process can (its files, its environment in /proc), and a "
    "background process that leaves its session and clears its environment can outlive it"
)
SANDBOXED_NOTE = (
    "sandboxed: no network, only the root directory is visible and writable (with a read-only "
    "system and a private /tmp)"
)

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Shown read-only in the sandbox (a symlink, as in merged-/usr systems, stays a symlink)."""
ETC_PATHS = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf",
    "group", "host.conf", "hostname", "hosts", "inputrc", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "locale.alias", "localtime", "magic", "magic.mime", "mime.types",
    "nsswitch.conf", "os-release", "passwd", "protocols", "resolv.conf", "services", "shells",
    "ssl", "timezone",
)
"""What programs read from ``/etc``; the rest of it (service configs, credentials) is absent."""
ENV_PASSED = ("PATH", "LANG", "TERM")
"""Variables of this process a command gets; everything else must be passed in ``env``."""
_RUN_MARKER = "COGENCY_SHELL_RUN"

_probe_cache: dict[str, bool] = {}


def sandbox_available(bwrap: str | None = None) -> bool:
    """Whether bubblewrap is installed and can actually create a sandbox here.

    Containers often ship ``bwrap`` but forbid the namespaces it needs, so it is tried once.
    """
    path = bwrap or shutil.which("bwrap")
    if not path:
        return False
    if path not in _probe_cache:
        try:
            done = subprocess.run(
                [path, *_system_view(), "--unshare-net", "--unshare-pid", "--die-with-parent",
                 "--cap-drop", "ALL", "/bin/sh", "-c", "true"],
                capture_output=True, timeout=10, check=False,
            )
            _probe_cache[path] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _probe_cache[path] = False
    return _probe_cache[path]


def shell_tool(
    root: str | os.PathLike[str],
    *,
    timeout: float = SHELL_TIMEOUT,
    max_output: int = MAX_SHELL_OUTPUT,
    sandbox: bool | Literal["auto"] = "auto",
    hidden: Sequence[str | os.PathLike[str]] = (),
    env: Mapping[str, str] | None = None,
    name: str = "shell",
) -> Tool:
    """A tool that runs ``/bin/sh -c command`` in ``root``.

    ``sandbox="auto"`` uses bubblewrap when it works and otherwise runs the command directly,
    saying so in the tool's description and in every result; ``True`` requires it
    (:class:`~cogency.errors.ConfigurationError` if missing); ``False`` never uses it.

    The command's environment holds only ``PATH``, ``LANG``, ``TERM`` (from this process),
    ``HOME`` and ``PWD`` (the root), and what ``env`` passes explicitly. ``hidden`` paths inside
    the sandbox's view (the root or the system) are replaced by empty ones; one that cannot be
    hidden (the root is inside it, or there is no sandbox) is a ``ConfigurationError``. An
    :class:`~cogency.Agent` adds its store's files to what is hidden.
    """
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ConfigurationError(f"shell root {str(base)!r} is not a directory; create it first")
    workdir = os.path.realpath(base)
    if timeout <= 0 or max_output <= 0:
        raise ConfigurationError("shell timeout and max_output must be positive")
    bwrap = shutil.which("bwrap")
    use_sandbox = sandbox is True or (sandbox == "auto" and sandbox_available(bwrap))
    if sandbox is True and not sandbox_available(bwrap):
        raise ConfigurationError(
            "sandbox=True but bubblewrap does not work here: install it (Debian: "
            "apt-get install bubblewrap) and allow user namespaces, or pass sandbox='auto'"
        )
    if use_sandbox and workdir == "/":
        raise ConfigurationError("the sandboxed shell's root cannot be / : give it a directory")
    passed = _check_env(env or {})
    masked = [os.path.realpath(Path(p).expanduser()) for p in hidden]
    if masked and not use_sandbox:
        raise ConfigurationError(
            f"cannot hide {masked[0]!r}: hidden paths need the sandbox, and bubblewrap "
            "does not work here (install it, or drop hidden=)"
        )
    for path in masked:
        _check_hideable(path, workdir)
    store_files: set[str] = set()
    killers = threading.BoundedSemaphore(4)
    note = SANDBOXED_NOTE if use_sandbox else UNSANDBOXED_NOTE

    def hide(paths: Sequence[str]) -> None:
        # The store's own files: hidden when they are in view (only ever inside the root).
        store_files.update(os.path.realpath(p) for p in paths)

    def argv(command: str) -> list[str]:
        if not use_sandbox:
            return ["/bin/sh", "-c", command]
        assert bwrap is not None
        args = [bwrap, *_system_view(), "--bind", workdir, workdir]
        for path in [*masked, *sorted(store_files)]:
            args += _mask(path, workdir)
        args += ["--chdir", workdir,
                 "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                 "--cap-drop", "ALL",  # as root, bwrap would keep e.g. CAP_SYS_MODULE/_TIME
                 "/bin/sh", "-c", command]
        return args

    async def shell(command: str) -> str:
        if not command.strip():
            raise ToolError("command must not be empty")
        if "\x00" in command:
            raise ToolError("command contains a NUL byte")
        marker = uuid.uuid4().hex
        process = await asyncio.create_subprocess_exec(
            *argv(command),
            cwd=workdir,
            env=_environment(workdir, passed, marker),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own session and process group
        )
        assert process.stdout is not None
        output = bytearray()
        stopped = ""
        try:
            async with asyncio.timeout(timeout):
                while chunk := await process.stdout.read(65_536):
                    output += chunk
                    if len(output) > max_output:
                        stopped = f"output passed {max_output} bytes; the command was stopped"
                        break
                if not stopped:
                    await process.wait()
        except TimeoutError:
            stopped = f"timed out after {timeout:g}s; the command was killed"
        finally:
            # Also ends what the command left running in the background, wherever it went:
            # the group at once, then the walk of /proc (tens of ms) in a thread of its own.
            _kill_group(process.pid)
            await in_thread(functools.partial(_kill_tree, process.pid, marker), killers,
                            "cogency-shell-kill")
            await asyncio.wait_for(process.wait(), 5)
        text = bytes(output[:max_output]).decode("utf-8", "replace")
        status = stopped or f"exit code {process.returncode}"
        return f"[{status}; {note}]\n{text}"

    return Tool(
        name,
        f"Run a shell command (/bin/sh -c) in the working directory; at most {timeout:g}s and "
        f"{max_output} bytes of output; secrets are not in its environment; {note}.",
        {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the shell command"}},
            "required": ["command"],
            "additionalProperties": False,
        },
        shell,
        timeout=timeout + 10,
        needs_approval=True,  # a command can change anything the process can
        hide=hide if use_sandbox else None,
        root=workdir,
        rebuild=lambda other: shell_tool(other, timeout=timeout, max_output=max_output,
                                         sandbox=sandbox, hidden=hidden, env=env, name=name),
    )


# -- the environment -------------------------------------------------------------------------


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigurationError("shell env= must map names to strings")
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise ConfigurationError(f"shell env= has an invalid variable {key!r}")
    return dict(env)


def _environment(workdir: str, passed: Mapping[str, str], marker: str) -> dict[str, str]:
    """An allow-list: nothing of this process's environment reaches the command unless named."""
    env = {name: os.environ[name] for name in ENV_PASSED if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.setdefault("TERM", "dumb")
    env.update(HOME=workdir, PWD=workdir)
    env.update(passed)
    env[_RUN_MARKER] = marker  # lets the end of the run find processes that left its session
    return env


# -- the sandbox's view ----------------------------------------------------------------------


def _links() -> list[str]:
    """``/bin`` → ``usr/bin`` and the like, recreated as symlinks inside the sandbox."""
    args = []
    for path in SYSTEM_PATHS[1:]:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
    return args


def _system_view() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", *_links()]
    for path in SYSTEM_PATHS[1:]:
        if not os.path.islink(path):
            args += ["--ro-bind-try", path, path]
    for name in ETC_PATHS:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return [*args, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]


def _visible_roots(workdir: str) -> Iterable[str]:
    yield workdir
    yield "/usr"
    for path in SYSTEM_PATHS[1:]:
        if not os.path.islink(path):
            yield path
    for name in ETC_PATHS:
        yield f"/etc/{name}"


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _check_hideable(path: str, workdir: str) -> None:
    if _inside(workdir, path):
        raise ConfigurationError(
            f"cannot hide {path!r}: the shell's root {workdir!r} is inside it (hide a "
            "directory inside the root, or choose a root outside it)"
        )


def _mask(path: str, workdir: str) -> list[str]:
    """bwrap arguments that replace ``path`` with an empty directory or an unreadable file, if
    it is in view.

    A path out of view is already absent; one that does not exist (yet) has nothing to show.
    """
    _check_hideable(path, workdir)
    if not any(_inside(path, top) for top in _visible_roots(workdir)):
        return []
    if not os.path.lexists(path):
        return []
    if os.path.isdir(path) and not os.path.islink(path):
        return ["--tmpfs", path]
    # bwrap mounts binds "nodev": the stand-in can be neither read nor written.
    return ["--ro-bind", "/dev/null", path]


# -- ending every process of a run -----------------------------------------------------------


def _kill_tree(leader: int, marker: str) -> None:
    """SIGKILL the command and everything it started, until nothing of it is left.

    Found by: descent from the command (parent pids), its session and process group (the
    command leads both), and the run marker in the environment (orphans that called setsid).
    """
    needle = f"{_RUN_MARKER}={marker}".encode()
    me = os.getpid()
    for _ in range(20):  # a process forking while it is killed shows up in the next round
        table = _processes()
        doomed = {pid for pid, (_, group, session) in table.items()
                  if group == leader or session == leader}
        doomed.add(leader)
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _) in table.items():
            children.setdefault(parent, []).append(pid)
        todo = list(doomed)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in doomed:
                    doomed.add(child)
                    todo.append(child)
        doomed |= {pid for pid in table if pid not in doomed and needle in _environ(pid)}
        doomed = {pid for pid in doomed if pid in table and pid != me}
        if not doomed:
            return
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _kill_group(leader: int) -> None:
    # The command leads its own process group (start_new_session); it may be gone already.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)


def _processes() -> dict[int, tuple[int, int, int]]:
    """Live (not zombie) processes: pid → (parent pid, process group, session)."""
    table: dict[int, tuple[int, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc (not Linux): the process group was killed, that is all
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = raw[raw.rfind(b")") + 2:].split()
        if len(fields) < 4 or fields[0] in (b"Z", b"X"):
            continue
        table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read(1_000_000)
    except OSError:
        return b""
