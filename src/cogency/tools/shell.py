"""A shell tool: one command in the root directory, with a time limit, an output cap, and an
environment without secrets; inside a bubblewrap sandbox (no network, nothing writable but the
root) where the machine has a working ``bwrap``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from .._redact import is_secret_name, redact
from ..errors import ConfigurationError, ToolError
from .base import Tool

SHELL_TIMEOUT = 30.0
MAX_SHELL_OUTPUT = 64_000
"""Bytes of combined stdout/stderr kept; a command that writes more is stopped."""

UNSANDBOXED_NOTE = (
    "NOT sandboxed (bubblewrap is not available here): the command can reach the network and "
    "write wherever this process can"
)
SANDBOXED_NOTE = "sandboxed: no network, only the root directory is writable"

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
                [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                 "--unshare-net", "--unshare-pid", "--die-with-parent", "true"],
                capture_output=True, timeout=10, check=False,
            )
            _probe_cache[path] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _probe_cache[path] = False
    return _probe_cache[path]


def clean_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) without secret-named variables or secret-looking values."""
    source = os.environ if env is None else env
    return {
        name: value for name, value in source.items()
        if not is_secret_name(name) and redact(value, env={}) == value
    }


def shell_tool(
    root: str | os.PathLike[str],
    *,
    timeout: float = SHELL_TIMEOUT,
    max_output: int = MAX_SHELL_OUTPUT,
    sandbox: bool | Literal["auto"] = "auto",
    hidden: Sequence[str | os.PathLike[str]] = (),
    name: str = "shell",
) -> Tool:
    """A tool that runs ``/bin/sh -c command`` in ``root``.

    ``sandbox="auto"`` uses bubblewrap when it works and otherwise runs the command directly,
    saying so in the tool's description and in every result; ``True`` requires it
    (:class:`~cogency.errors.ConfigurationError` if missing); ``False`` never uses it.
    ``hidden`` directories are replaced by empty ones inside the sandbox (e.g. where the
    database or credentials live). The process group is killed at ``timeout`` seconds or
    when the output passes ``max_output`` bytes.
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
    note = SANDBOXED_NOTE if use_sandbox else UNSANDBOXED_NOTE
    masked = [os.path.realpath(Path(p).expanduser()) for p in hidden]

    def argv(command: str) -> list[str]:
        if not use_sandbox:
            return ["/bin/sh", "-c", command]
        assert bwrap is not None
        args = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", "/dev/shm"]
        for path in masked:
            if os.path.isdir(path) and not workdir.startswith(path.rstrip("/") + "/"):
                args += ["--tmpfs", path]
        args += ["--bind", workdir, workdir, "--chdir", workdir,
                 "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                 "--die-with-parent", "--new-session", "/bin/sh", "-c", command]
        return args

    async def shell(command: str) -> str:
        if not command.strip():
            raise ToolError("command must not be empty")
        if "\x00" in command:
            raise ToolError("command contains a NUL byte")
        env = clean_env()
        env.setdefault("PATH", os.defpath)
        env["PWD"] = workdir
        process = await asyncio.create_subprocess_exec(
            *argv(command),
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so the whole tree can be killed
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
            # Also ends what the command left running in the background.
            _kill_group(process.pid)
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
    )


def _kill_group(pid: int) -> None:
    # The group id is the child's pid (start_new_session); it may be gone already.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
