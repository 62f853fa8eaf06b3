"""LangGraph under the benchmark: a ReAct graph (model node, ToolNode, tools_condition) built
with StateGraph, a fake BaseChatModel, and AsyncSqliteSaver keyed by thread_id.

The graph is LangGraph's documented hand-built agent; ``create_react_agent`` moved to the
``langchain`` package in LangGraph 1.0, which is not a dependency of ``langgraph``.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

from bench.peers import _harness
from bench.peers._harness import SESSION_ID, Script

NAME = "langgraph"
DISTRIBUTIONS = ("langgraph", "langgraph-checkpoint-sqlite", "langchain-core")
IMPORTS = (
    "from langgraph.graph import StateGraph, MessagesState, START; "
    "from langgraph.prebuilt import ToolNode, tools_condition; "
    "from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver; "
    "from langchain_core.language_models import BaseChatModel; "
    "from langchain_core.tools import tool"
)

_FAKE: Any = None


def _fake_class() -> Any:
    """The fake chat model class, defined on first use so importing this module stays light."""
    global _FAKE
    if _FAKE is not None:
        return _FAKE
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class FakeChat(BaseChatModel):
        """Replies from the Script: a final AIMessage or one with a tool call. Copies nothing."""

        script: Any

        @property
        def _llm_type(self) -> str:
            return "bench-fake"

        def _reply(self, messages: list[Any]) -> ChatResult:
            item = self.script.next(len(messages))
            if item[0] == "tool":
                message = AIMessage(
                    content="",
                    tool_calls=[{"name": item[1], "args": {"key": item[2]},
                                 "id": f"call_{self.script.calls}", "type": "tool_call"}],
                )
            else:
                message = AIMessage(content=item[1])
            return ChatResult(generations=[ChatGeneration(message=message)])

        def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            return self._reply(messages)

        async def _agenerate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                             **kwargs: Any) -> ChatResult:
            return self._reply(messages)

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self  # the script decides the calls; nothing to bind

    _FAKE = FakeChat
    return FakeChat


def make_tool() -> Any:
    from langchain_core.tools import tool

    return tool(_harness.lookup)


def _graph(script: Script, tool: Any, checkpointer: Any = None) -> Any:
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    tools = [tool]
    model = _fake_class()(script=script).bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def construct(script: Script, tool: Any) -> Any:
    return _graph(script, tool)


class _Session:
    def __init__(self, graph: Any, conn: Any) -> None:
        self.graph = graph
        self.conn = conn
        self.config = {"configurable": {"thread_id": SESSION_ID}}

    async def turn(self, text: str) -> str:
        from langchain_core.messages import HumanMessage

        if self.conn is None:  # no checkpointer: every run is a fresh conversation
            state = await self.graph.ainvoke({"messages": [HumanMessage(text)]})
        else:
            state = await self.graph.ainvoke({"messages": [HumanMessage(text)]}, self.config)
        return state["messages"][-1].content

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    def stored(self, db: sqlite3.Connection) -> int:
        return db.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = ?", (SESSION_ID,)
        ).fetchone()[0]

    async def synchronous(self) -> set[int]:
        async with self.conn.execute("PRAGMA synchronous") as cursor:
            return {(await cursor.fetchone())[0]}


async def open_session(script: Script, db_path: str | None, synchronous: str = "normal"
                       ) -> _Session:
    if db_path is None:
        return _Session(_graph(script, make_tool()), None)
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(db_path)
    await conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")  # setup() turns WAL on
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    return _Session(_graph(script, make_tool(), saver), conn)


if __name__ == "__main__":
    _harness.main(sys.modules[__name__])
