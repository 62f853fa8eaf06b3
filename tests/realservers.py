"""Real servers for the provider tests, one of each per test session.

* llama.cpp's server (xllamacpp, in this process) with the SmolLM2-135M model that
  ``cogency.llm._local`` fetches: it speaks OpenAI's ``/v1/chat/completions`` and Anthropic's
  ``/v1/messages``.
* LiteLLM's proxy (a pinned version in its own virtualenv, see ``.ci/run``), in front of that
  llama.cpp server: it speaks Gemini's ``/v1beta/models/…:generateContent``. Its start takes
  tens of seconds, so it is started as soon as a test that needs it is collected.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

LLAMA_CONTEXT = 4096
LITELLM_VERSION = "1.106.2"
LITELLM_KEY = "sk-cogency-test-0123456789abcdef"
MODEL = "smollm"
"""The name LiteLLM serves the llama.cpp model under."""


def litellm_command() -> Path:
    """Where ``.ci/run`` installs LiteLLM's proxy (``$COGENCY_LITELLM`` overrides it)."""
    default = Path.home() / ".cache" / "cogency-ci" / f"litellm-{LITELLM_VERSION}" / "bin"
    return Path(os.environ.get("COGENCY_LITELLM") or default / "litellm")


class Servers:
    """The session's servers, started on first use (``llama_url``) or early (``start_litellm``)."""

    def __init__(self) -> None:
        self._llama: Any = None
        self.llama_url = ""
        self._litellm: subprocess.Popen[bytes] | None = None
        self._litellm_log: Any = None
        self.litellm_url = ""
        self.litellm_error = ""

    def llama(self) -> str:
        """The llama.cpp server's root URL (``…/v1`` is its OpenAI API)."""
        if self._llama is None:
            import xllamacpp

            from cogency.llm._local import default_model_path

            params = xllamacpp.CommonParams()
            params.model.path = str(default_model_path())
            params.n_ctx = LLAMA_CONTEXT
            params.n_parallel = 1
            params.verbosity = -1
            params.hostnames = ["127.0.0.1"]
            params.port = 0
            params.cpuparams.n_threads = 1
            params.cpuparams_batch.n_threads = 1
            self._llama = xllamacpp.Server(params)
            self.llama_url = self._llama.listening_address.rstrip("/")
        return self.llama_url

    def start_litellm(self) -> None:
        """Start LiteLLM's proxy in the background (it is waited for in :meth:`litellm`)."""
        if self._litellm is not None or self.litellm_error:
            return
        command = litellm_command()
        if not command.is_file():
            self.litellm_error = (f"LiteLLM's proxy is not installed at {command} (.ci/run "
                                  f"installs litellm[proxy]=={LITELLM_VERSION} there)")
            return
        llama = self.llama()
        work = Path(tempfile.mkdtemp(prefix="cogency-litellm-"))
        config = work / "config.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {llama}/v1\n"
            "      api_key: not-needed\n"
        )
        port = _free_port()
        self.litellm_url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "LITELLM_MASTER_KEY": LITELLM_KEY,
               "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from the internet
               "LITELLM_TELEMETRY": "False", "NO_PROXY": "127.0.0.1,localhost"}
        self._litellm_log = open(work / "litellm.log", "wb")  # noqa: SIM115 (closed in stop)
        self._litellm = subprocess.Popen(
            [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=self._litellm_log, stderr=subprocess.STDOUT, env=env, cwd=work,
            start_new_session=True, preexec_fn=_die_with_parent,
        )

    def litellm(self, wait: float = 240.0) -> str:
        """The proxy's URL once it answers (raises with its log if it does not)."""
        self.start_litellm()
        if self.litellm_error:
            raise RuntimeError(self.litellm_error)
        assert self._litellm is not None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self._litellm.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.litellm_url}/health/liveliness",
                                            timeout=2) as reply:
                    if reply.status == 200:
                        return self.litellm_url
            except OSError:
                time.sleep(0.5)
        log = Path(self._litellm_log.name).read_text(errors="replace")[-3000:]
        self.litellm_error = f"LiteLLM's proxy did not start within {wait:g} s:\n{log}"
        raise RuntimeError(self.litellm_error)

    def stop(self) -> None:
        if self._litellm is not None and self._litellm.poll() is None:
            os.killpg(self._litellm.pid, signal.SIGTERM)  # its own session: it and its workers
            try:
                self._litellm.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._litellm.pid, signal.SIGKILL)
        if self._litellm_log is not None:
            self._litellm_log.close()
        self._llama = None  # the last reference: llama.cpp's server stops with it


try:
    _PRCTL = ctypes.CDLL(None).prctl  # loaded before any fork: the child only calls it
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child: a test session that is killed takes its proxy with it (Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


SERVERS = Servers()
"""One per test session (pytest imports this module once)."""
