"""OpenAI Agents SDK under the benchmark: a fake ``Model`` (get_response/stream_response
returning ModelResponse), ``Runner.run`` with tracing disabled, and ``SQLiteSession``."""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Any

from bench.peers import _harness
from bench.peers._harness import SESSION_ID, Script

NAME = "openai_agents"
DISTRIBUTIONS = ("openai-agents", "openai")
IMPORTS = "from agents import Agent, Runner, SQLiteSession, function_tool, Model, ModelResponse"

_CLASSES: Any = None


def _classes() -> Any:
    """The fake model and the session subclass, defined on first use (light module import)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    from agents import Model, ModelResponse, SQLiteSession, Usage, set_tracing_disabled
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    class FakeModel(Model):
        """Replies from the Script; builds only the one output item it returns."""

        def __init__(self, script: Script) -> None:
            self.script = script

        def _reply(self, input: Any) -> ModelResponse:
            item = self.script.next(len(input) if isinstance(input, list) else 1)
            n = self.script.calls
            if item[0] == "tool":
                output: Any = ResponseFunctionToolCall(
                    arguments=json.dumps({"key": item[2]}), call_id=f"call_{n}", name=item[1],
                    type="function_call", id=f"fc_{n}", status="completed",
                )
            else:
                output = ResponseOutputMessage(
                    id=f"msg_{n}", role="assistant", status="completed", type="message",
                    content=[ResponseOutputText(text=item[1], type="output_text", annotations=[])],
                )
            return ModelResponse(output=[output], usage=Usage(), response_id=None)

        async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                               tools: Any, output_schema: Any, handoffs: Any, tracing: Any,
                               **kwargs: Any) -> ModelResponse:
            return self._reply(input)

        async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark does not stream")
            yield  # pragma: no cover  (makes this an async generator)

    class Session(SQLiteSession):
        """SQLiteSession with ``synchronous`` set on each (thread-local) connection it opens,
        read back into ``seen``."""

        synchronous = "normal"
        seen: set[int] = set()

        @classmethod
        def _configure_connection(cls, conn: sqlite3.Connection) -> None:  # type: ignore[override]
            SQLiteSession._configure_connection(conn)  # WAL
            conn.execute(f"PRAGMA synchronous = {cls.synchronous.upper()}")
            cls.seen.add(conn.execute("PRAGMA synchronous").fetchone()[0])

    _CLASSES = (FakeModel, Session)
    return _CLASSES


def make_tool() -> Any:
    from agents import function_tool

    return function_tool(_harness.lookup)


def _agent(script: Script, tool: Any) -> Any:
    from agents import Agent

    fake, _ = _classes()
    return Agent(name="bench", instructions="You are a benchmark agent.", model=fake(script),
                 tools=[tool])


def construct(script: Script, tool: Any) -> Any:
    return _agent(script, tool)


class _Session:
    def __init__(self, agent: Any, session: Any) -> None:
        from agents import RunConfig

        self.agent = agent
        self.session = session
        self.config = RunConfig(tracing_disabled=True)

    async def turn(self, text: str) -> str:
        from agents import Runner

        result = await Runner.run(self.agent, text, session=self.session, run_config=self.config)
        return result.final_output

    async def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def stored(self, db: sqlite3.Connection) -> int:
        return db.execute(
            "SELECT count(*) FROM agent_messages WHERE session_id = ?", (SESSION_ID,)
        ).fetchone()[0]

    async def synchronous(self) -> set[int]:
        return set(type(self.session).seen)


async def open_session(script: Script, db_path: str | None, synchronous: str = "normal"
                       ) -> _Session:
    agent = _agent(script, make_tool())
    if db_path is None:
        return _Session(agent, None)
    _, session_class = _classes()
    session_class.synchronous, session_class.seen = synchronous, set()
    return _Session(agent, session_class(SESSION_ID, db_path))


if __name__ == "__main__":
    _harness.main(sys.modules[__name__])
