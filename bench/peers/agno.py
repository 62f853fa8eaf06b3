"""Agno under the benchmark: a fake ``Model`` subclass, ``Agent.arun`` with ``AsyncSqliteDb``
(aiosqlite through SQLAlchemy's asyncio extension, hence greenlet), a fixed session_id and
``add_history_to_context=True`` (Agno's default window: the last 3 runs)."""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Any

from bench.peers import _harness
from bench.peers._harness import SESSION_ID, USER_ID, Script

NAME = "agno"
DISTRIBUTIONS = ("agno", "sqlalchemy", "aiosqlite", "greenlet")
IMPORTS = (
    "from agno.agent import Agent; from agno.models.base import Model; "
    "from agno.models.response import ModelResponse; from agno.db.sqlite import AsyncSqliteDb"
)

_FAKE: Any = None


def _fake_class() -> Any:
    """The fake model class, defined on first use so importing this module stays light."""
    global _FAKE
    if _FAKE is not None:
        return _FAKE
    from dataclasses import dataclass

    from agno.models.base import Model
    from agno.models.response import ModelResponse

    @dataclass
    class FakeModel(Model):
        """Replies from the Script at Agno's model boundary (``invoke``/``ainvoke``)."""

        id: str = "bench-fake"
        name: str = "bench-fake"
        provider: str = "bench"
        script: Any = None

        def _reply(self, messages: list[Any]) -> ModelResponse:
            seen = len(messages) - (1 if messages and messages[0].role == "system" else 0)
            item = self.script.next(seen)
            if item[0] == "tool":
                return ModelResponse(
                    role="assistant",
                    tool_calls=[{
                        "id": f"call_{self.script.calls}", "type": "function",
                        "function": {"name": item[1], "arguments": json.dumps({"key": item[2]})},
                    }],
                )
            return ModelResponse(role="assistant", content=item[1])

        def invoke(self, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            return self._reply(messages)

        async def ainvoke(self, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            return self._reply(messages)

        def invoke_stream(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            yield self._reply(messages)

        async def ainvoke_stream(self, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            yield self._reply(messages)

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> Any:
            return response

        def _parse_provider_response_delta(self, response: Any) -> Any:
            return response

    _FAKE = FakeModel
    return FakeModel


def make_tool() -> Any:
    return _harness.lookup  # Agno takes plain functions and reads them when it runs


def construct(script: Script, tool: Any) -> Any:
    from agno.agent import Agent

    return Agent(model=_fake_class()(script=script), tools=[tool], telemetry=False)


class _Session:
    def __init__(self, agent: Any, db: Any, seen: set[int] | None = None) -> None:
        self.agent = agent
        self.db = db
        self.seen = seen if seen is not None else set()

    async def turn(self, text: str) -> str:
        output = await self.agent.arun(text)
        return output.content

    async def close(self) -> None:
        if self.db is not None:
            await self.db.db_engine.dispose()

    def stored(self, db: sqlite3.Connection) -> int:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        runs = next((t for t in tables if t.endswith("runs") and "schedule" not in t), None)
        if runs is None:
            raise AssertionError(f"no runs table in the Agno database (tables: {sorted(tables)})")
        return db.execute(
            f"SELECT count(*) FROM {runs} WHERE session_id = ?", (SESSION_ID,)
        ).fetchone()[0]

    async def synchronous(self) -> set[int]:
        return set(self.seen)


async def open_session(script: Script, db_path: str | None, synchronous: str = "normal"
                       ) -> _Session:
    from agno.agent import Agent

    model = _fake_class()(script=script)
    if db_path is None:
        agent = Agent(model=model, tools=[_harness.lookup], telemetry=False)
        return _Session(agent, None)
    from agno.db.sqlite import AsyncSqliteDb
    from sqlalchemy import event

    db = AsyncSqliteDb(db_file=db_path)
    seen: set[int] = set()

    @event.listens_for(db.db_engine.sync_engine, "connect")
    def _synchronous(dbapi_connection: Any, _record: Any) -> None:
        # Agno turns WAL on itself and leaves synchronous at its default (FULL).
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        cursor.execute("PRAGMA synchronous")
        seen.add(cursor.fetchone()[0])
        cursor.close()

    agent = Agent(
        model=model, tools=[_harness.lookup], db=db, session_id=SESSION_ID, user_id=USER_ID,
        add_history_to_context=True, telemetry=False,
    )
    return _Session(agent, db, seen)


if __name__ == "__main__":
    _harness.main(sys.modules[__name__])
