"""Model factories the CLI tests name with ``--llm cli_models:…`` (tests/ is on PYTHONPATH).

The script comes from the JSON file in ``$COGENCY_TEST_SCRIPT``; the string ``"<hang>"``
stands for a reply that never comes (to interrupt a run), ``"<rate-limit>"`` for a provider's
refusal that the agent retries.
"""

from __future__ import annotations

import asyncio
import json
import os

from cogency.errors import AuthenticationError, RateLimitError
from cogency.testing import ScriptedLLM


async def _hang(messages):
    await asyncio.Event().wait()


def _gated(path: str, reply: object):
    async def wait(messages):
        while not os.path.exists(path):
            await asyncio.sleep(0.02)
        return reply

    return wait


def scripted() -> ScriptedLLM:
    """The script; ``{"<gate>": PATH, "reply": R}`` answers R once the file PATH exists."""
    with open(os.environ["COGENCY_TEST_SCRIPT"], encoding="utf-8") as source:
        script = json.load(source)
    special = {"<hang>": _hang, "<rate-limit>": RateLimitError("HTTP 429: slow down")}
    if os.environ.get("COGENCY_TEST_STARTED"):  # making the model leaves this file behind
        with open(os.environ["COGENCY_TEST_STARTED"], "w"):
            pass
    return ScriptedLLM([
        special.get(item, item) if isinstance(item, str)
        else _gated(item["<gate>"], item["reply"]) if isinstance(item, dict) and "<gate>" in item
        else item
        for item in script
    ])


def bad_key() -> ScriptedLLM:
    return ScriptedLLM([AuthenticationError("the provider rejected the key: set OPENAI_API_KEY")])


def streaming() -> ScriptedLLM:
    """The script, each reply streamed in 8-character pieces (token events)."""
    llm = scripted()
    llm.chunk = 8
    return llm


class _SlowModel(ScriptedLLM):
    """A model that takes a while to load and to answer (like the offline one on a slow box)."""

    name = "slow-test-model"

    loaded = False

    async def start(self) -> None:
        if not self.loaded:  # like the offline model: slow once, then ready
            gate = os.environ.get("COGENCY_TEST_LOAD_GATE")
            if gate:  # loaded once the test says so (the test sees "loading…" first)
                while not os.path.exists(gate):
                    await asyncio.sleep(0.02)
            else:
                await asyncio.sleep(1.0)
            self.loaded = True


def slow() -> ScriptedLLM:
    llm = scripted()
    return _SlowModel(list(llm._script.queue), delay=float(os.environ.get("COGENCY_TEST_DELAY", "1.5")))


def big_window() -> ScriptedLLM:
    """The script, on a model whose context window takes a 1 MB query."""
    llm = scripted()
    llm.context_window = 2_000_000
    return llm


def small_window() -> ScriptedLLM:
    """The scripted model with a 2,048-token context window."""
    model = scripted()
    model.context_window = 2048
    return model


def cannot_learn() -> ScriptedLLM:
    """The script, on a model too small to learn profiles (as the default offline model)."""
    llm = scripted()
    llm.learns = False  # type: ignore[attr-defined]
    return llm


def reporting() -> ScriptedLLM:
    """The script; when the process exits, writes to ``$COGENCY_TEST_REPORT`` whether it ever
    loaded the exact token encoding (and tiktoken) and its peak resident memory."""
    import atexit
    import sys

    def report() -> None:
        from cogency.tokens import loaded

        status = open("/proc/self/status").read() if os.path.exists("/proc/self/status") else ""
        peak = next((int(line.split()[1]) for line in status.splitlines()
                     if line.startswith("VmHWM:")), None)
        with open(os.environ["COGENCY_TEST_REPORT"], "w", encoding="utf-8") as out:
            json.dump({"loaded": loaded(), "tiktoken": "tiktoken" in sys.modules,
                       "peak_kib": peak}, out)

    atexit.register(report)
    return scripted()
