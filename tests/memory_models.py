"""Models the durable-learning tests name with ``--llm memory_models:agent`` (tests/ is on
PYTHONPATH): one endless script for the agent and its learning, whatever the order of calls.

- an agent step answers ``noted: QUERY``;
- a learning extraction (its prompt quotes ``<interaction>`` blocks) learns one goal per
  interaction whose query reads ``remember: GOAL``; with ``$COGENCY_TEST_HANG_LEARNING`` set
  it never answers (a learner to kill mid-learning), with ``$COGENCY_TEST_FAIL_LEARNING``
  it raises (a provider that is down), with ``$COGENCY_TEST_LEARN_GATE`` naming a file it
  waits until that file exists (learning held in flight);
- a consolidation keeps the goals it is shown.

Every learning prompt is appended to the file ``$COGENCY_TEST_CALLS`` (one JSON string per
line) when that is set, so a test can count what the learning model was asked.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re

from cogency.testing import ScriptedLLM

_QUERY = re.compile(r"^Query: remember: (.+)$", re.M)


async def _reply(messages):
    prompt = messages[-1]["content"]
    learning = "<interaction>\nQuery:" in prompt
    consolidating = "consolidate" in prompt and "<profile>" in prompt
    if (learning or consolidating) and os.environ.get("COGENCY_TEST_CALLS"):
        with open(os.environ["COGENCY_TEST_CALLS"], "a", encoding="utf-8") as calls:
            calls.write(json.dumps(prompt) + "\n")
    if learning:
        if os.environ.get("COGENCY_TEST_HANG_LEARNING"):
            await asyncio.Event().wait()
        if os.environ.get("COGENCY_TEST_FAIL_LEARNING"):
            raise RuntimeError("provider down")
        gate = os.environ.get("COGENCY_TEST_LEARN_GATE")
        while gate and not os.path.exists(gate):
            await asyncio.sleep(0.02)
        return {"preferences": [], "goals": _QUERY.findall(prompt), "expertise": [],
                "communication_style": "", "project_context": [], "interests": [],
                "constraints": [], "success_pattern": "", "failure_pattern": ""}
    if consolidating:
        shown = json.loads(prompt.split("<profile>\n", 1)[1].split("\n</profile>", 1)[0])
        return {"goals": shown.get("goals", [])}
    query = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return {"secure": True, "response": f"noted: {query}", "actions": []}


def agent() -> ScriptedLLM:
    return ScriptedLLM(itertools.repeat(_reply))
