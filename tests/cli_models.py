"""Model factories the CLI tests name with ``--llm cli_models:…`` (tests/ is on PYTHONPATH).

The script comes from the JSON file in ``$COGENCY_TEST_SCRIPT``; the string ``"<hang>"``
stands for a reply that never comes (to interrupt a run).
"""

from __future__ import annotations

import asyncio
import json
import os

from cogency.errors import AuthenticationError
from cogency.testing import ScriptedLLM


async def _hang(messages):
    await asyncio.Event().wait()


def scripted() -> ScriptedLLM:
    with open(os.environ["COGENCY_TEST_SCRIPT"], encoding="utf-8") as source:
        script = json.load(source)
    return ScriptedLLM([_hang if item == "<hang>" else item for item in script])


def bad_key() -> ScriptedLLM:
    return ScriptedLLM([AuthenticationError("the provider rejected the key: set OPENAI_API_KEY")])


def small_window() -> ScriptedLLM:
    """The scripted model with a 2,048-token context window."""
    model = scripted()
    model.context_window = 2048
    return model
