"""Cogency under the benchmark: ScriptedLLM replies computed by one callable, SQLiteStore."""

from __future__ import annotations

import itertools
import sqlite3
import sys
from typing import Any

from bench.peers import _harness
from bench.peers._harness import SESSION_ID, USER_ID, Script

NAME = "cogency"
DISTRIBUTIONS = ("cogency",)
IMPORTS = (
    "from cogency import Agent, tool; from cogency.storage import SQLiteStore; "
    "from cogency.testing import ScriptedLLM"
)
def _model(script: Script) -> Any:
    from cogency.testing import ScriptedLLM

    def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        item = script.next(len(messages) - 1)  # messages[0] is the system context
        if item[0] == "tool":
            return {"actions": [{"name": item[1], "args": {"key": item[2]}}]}
        return {"response": item[1]}

    # An endless script of one callable: nothing is built per call, nothing grows.
    return ScriptedLLM(itertools.repeat(reply))


def make_tool() -> Any:
    from cogency import tool

    return tool(_harness.lookup)


def construct(script: Script, tool: Any) -> Any:
    from cogency import Agent
    from cogency.storage import SQLiteStore

    return Agent(_model(script), tools=[tool], store=SQLiteStore(":memory:"))


class _Session:
    def __init__(self, script: Script, db_path: str | None, synchronous: str) -> None:
        from cogency import Agent
        from cogency.storage import SQLiteStore

        self.store = SQLiteStore(db_path or ":memory:", synchronous=synchronous)
        self.llm = _model(script)
        self.agent = Agent(self.llm, tools=[make_tool()], store=self.store)
        self.conversation_id = SESSION_ID if db_path else None

    async def turn(self, text: str) -> str:
        result = await self.agent.run(text, USER_ID, self.conversation_id)
        self.llm.calls.clear()  # ScriptedLLM keeps references to what it was sent; drop them
        return result.response or ""

    async def close(self) -> None:
        await self.agent.close()
        await self.store.close()

    def stored(self, db: sqlite3.Connection) -> int:
        return db.execute(
            "SELECT count(*) FROM conversation_messages WHERE conversation_id = ?", (SESSION_ID,)
        ).fetchone()[0]

    async def synchronous(self) -> set[int]:
        # The store's one connection (PRAGMAs are per connection). At "full" it commits as
        # at NORMAL (1), and the store flushes the log itself before it tells an outcome
        # (SQLiteStore's docstring): FULL (2) is read back as every commit of the
        # conversation flushed. (This run's strace counts the flushes per turn.)
        pragma = await self.store._run(lambda db: db.execute("PRAGMA synchronous").fetchone()[0])
        store = self.store
        if store.synchronous == "full" and pragma == 1 and 0 < store._commits == store._flushed:
            return {2}
        return {pragma}


async def open_session(script: Script, db_path: str | None, synchronous: str = "normal"
                       ) -> _Session:
    return _Session(script, db_path, synchronous)


if __name__ == "__main__":
    _harness.main(sys.modules[__name__])
