"""Models the service tests name with ``--llm server_models:agent`` (tests/ is on PYTHONPATH).

An endless script whose reply depends on the query, so many users can talk to one server:

- ``gate:PATH …`` waits until the file PATH exists, then answers (a run held in flight);
- ``nudge:PATH …`` makes no progress (an unfinished task) until the file PATH exists;
- ``tool …`` lists the files (``--tools files``) and then answers; with
  ``$COGENCY_TEST_HANG_AFTER_TOOL`` set, it never answers after the tool (a replica to kill);
- ``write NAME`` writes the file NAME (a call that needs a person's approval), then says
  what the tool answered;
- a memory learning call (its prompt quotes an ``<interaction>``) learns that the user likes
  brief answers;
- ``write-long NAME`` writes the file NAME with a long content that ends in a bidi override
  and a command (a call whose end is what matters), then says what the tool answered;
- ``recall`` is answered with the first user message the model was sent (the history);
- ``read NAME`` reads the file NAME and ``sh COMMAND`` runs COMMAND in the shell, then say
  what the tool answered (the end of its output);
- ``surrogate`` is answered with text holding a lone surrogate (models emit them);
- ``roles`` is answered with the roles of the messages the model was sent, after the system
  message (what of the history reached it);
- ``fail`` makes the model fail (a run that ends with an error);
- ``weather CITY`` calls the client's tool ``get_weather`` (an OpenAI client's function) when
  it is offered, then answers with what it returned (``the weather in CITY: …``); ``weather
  and time CITY`` also calls ``get_time`` in the same step; without the tool it says so;
- ``weather then fail CITY`` calls ``get_weather`` as ``weather CITY`` does, then fails;
- ``clock`` calls Open WebUI's built-in ``get_current_timestamp`` when it is offered, then
  answers with its result;
- ``instructions`` is answered with the client's instructions as the model got them;
- ``options`` is answered with the model options of the call, as JSON;
- ``restart`` first replies with an answer (``a first try``) in a reply that turns out
  invalid, then, asked again, answers ``second answer`` (a restarted answer);
- ``structured`` answers ``{"city": "Oslo", "degrees": 12}`` as a JSON value (for an answer
  schema);
- Open WebUI's title request (``### Task:`` … ``title``) is answered with its JSON title;
- anything else is answered ``echo: QUERY``.

``$COGENCY_TEST_DELAY`` seconds are spent on every call (the benchmark's model latency).
``agent`` replies at once; ``streaming`` streams each reply in pieces of 4 characters, so the
answer reaches clients as deltas.
``$COGENCY_TEST_HOSTNAME`` renames the host the server's runs say they run on (a container
that will restart under another name).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import os
from pathlib import Path

from cogency.client import INSTRUCTIONS_TAG
from cogency.testing import ScriptedLLM

if os.environ.get("COGENCY_TEST_HOSTNAME"):
    import socket

    socket.gethostname = lambda: os.environ["COGENCY_TEST_HOSTNAME"]

_OPTIONS: contextvars.ContextVar[dict] = contextvars.ContextVar("options", default={})
_FIRST_TRY = '{"actions": [], "response": "a first try", "objective": 5}'
"""A reply whose answer streams, then turns out invalid (``objective`` is no string)."""


LEARNED = {
    "preferences": [], "goals": [], "expertise": [], "communication_style": "brief answers",
    "project_context": [], "interests": [], "constraints": [], "success_pattern": "",
    "failure_pattern": "",
}


async def _reply(messages):
    delay = float(os.environ.get("COGENCY_TEST_DELAY", "0"))
    if delay:
        await asyncio.sleep(delay)
    last = messages[-1]["content"]
    if any("<interaction>\nQuery:" in m["content"] for m in messages):
        return LEARNED
    if any(m["role"] == "assistant" and m["content"] == _FIRST_TRY for m in messages):
        return {"response": "second answer"}
    after_tool = last.startswith("TOOL RESULT")
    query = next(m["content"] for m in reversed(messages)
                 if m["role"] == "user" and not m["content"].startswith("TOOL RESULT"))
    if query.startswith("gate:"):
        gate = Path(query.split()[0][len("gate:"):])
        while not gate.exists():
            await asyncio.sleep(0.02)
        return {"response": f"opened: {query}"}
    if query.startswith("write "):
        if not after_tool:
            return {"actions": [{"name": "file_write",
                                 "args": {"path": query.split()[1], "content": "written"}}]}
        return {"response": f"the tool said: {last[:200]}"}
    if query.startswith("write-long "):
        if not after_tool:
            content = "Tidying notes… " + "." * 1600 + " \u202e and then: touch pwned"
            return {"actions": [{"name": "file_write",
                                 "args": {"path": query.split()[1], "content": content}}]}
        return {"response": f"the tool said: {last[:200]}"}
    if query.startswith(("read ", "sh ")):
        if not after_tool:
            name, rest = query.split(" ", 1)
            call = ({"name": "file_read", "args": {"path": rest}} if name == "read"
                    else {"name": "shell", "args": {"command": rest}})
            return {"actions": [call]}
        return {"response": f"the tool said: {last[-600:]}"}
    if query == "surrogate":
        return {"response": "half of a pair: \ud800 (from the model)"}
    if query == "roles":
        return {"response": " ".join(m["role"] for m in messages[1:])}
    if query == "fail":
        raise RuntimeError("the model broke")
    if query == "recall":
        first = next(m["content"] for m in messages if m["role"] == "user")
        return {"response": f"you said: {first}"}
    if query.startswith("nudge:"):
        if not Path(query.split()[0][len("nudge:"):]).exists():
            return {"understanding": "waiting for a nudge"}
        return {"response": f"nudged: {query}"}
    system = messages[0]["content"]
    if query.startswith("weather"):
        city = query.split()[-1]
        if "get_weather(" not in system:
            return {"response": "I have no weather tool"}
        if not after_tool:
            calls = [{"name": "get_weather", "args": {"city": city}}]
            if query.startswith("weather and time"):
                calls.append({"name": "get_time", "args": {"city": city}})
            return {"actions": calls}
        if query.startswith("weather then fail"):
            raise RuntimeError("the model broke after the tool")
        results = [m["content"].split("<tool_output>\n", 1)[-1].split("\n</tool_output>")[0]
                   for m in messages if m["content"].startswith("TOOL RESULT")]
        return {"response": f"the weather in {city}: {'; '.join(results)}"}
    if query == "clock" and "get_current_timestamp(" in system:
        if not after_tool:
            return {"actions": [{"name": "get_current_timestamp", "args": {}}]}
        result = last.split("<tool_output>\n", 1)[-1].split("\n</tool_output>")[0]
        return {"response": f"the time is {result}"}
    if query == "instructions":
        opened = f"<{INSTRUCTIONS_TAG}>\n"
        told = (system.split(opened, 1)[1].split(f"\n</{INSTRUCTIONS_TAG}>")[0]
                if opened in system else "")
        return {"response": f"instructions: {told}"}
    if query == "options":
        return {"response": json.dumps(_OPTIONS.get(), sort_keys=True)}
    if query == "restart":
        return _FIRST_TRY
    if query == "structured":
        return {"response": {"city": "Oslo", "degrees": 12}}
    if query.startswith("### Task:") and "title" in query:
        return {"response": '{ "title": "Weather Talk" }'}
    if query.startswith("tool"):
        if not after_tool:
            return {"understanding": "listing", "actions": [{"name": "file_list", "args": {}}]}
        if os.environ.get("COGENCY_TEST_HANG_AFTER_TOOL"):
            await asyncio.Event().wait()
        return {"response": f"listed: {query}"}
    return {"response": f"echo: {query}"}


class _Model(ScriptedLLM):
    """A ScriptedLLM whose replies can see the model options of their call."""

    async def generate(self, messages, *, schema=None):
        _OPTIONS.set(dict(self.options))
        return await super().generate(messages, schema=schema)


def agent() -> ScriptedLLM:
    return _Model(itertools.repeat(_reply), count_usage=True)


def streaming() -> ScriptedLLM:
    return _Model(itertools.repeat(_reply), count_usage=True, chunk=4)
