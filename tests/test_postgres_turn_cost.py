"""A PostgreSQL turn reads the rows it needs, not more as the conversation, or what else its
user has, grows: counted in the server's own statistics, not timed."""

from __future__ import annotations

import pgutil

from cogency import Agent, tool
from cogency.state import State
from cogency.storage import PostgresStore
from cogency.testing import ScriptedLLM

TURNS = 40
OTHERS = 150
"""Open tasks and finished conversations the same user has besides the measured one."""


@tool
def note(marker: str) -> str:
    """Note a marker."""
    return f"noted {marker}"


async def _rows_read(store: PostgresStore, observer) -> dict[str, int]:
    """Rows of each table the server has read so far (index and table scans)."""
    pool = await store._ready()
    async with pool.acquire() as db:  # the store's one connection: hand its counts over now
        await db.execute("SELECT pg_stat_force_next_flush()")
    await observer.execute("SELECT pg_stat_clear_snapshot()")
    rows = await observer.fetch(
        "SELECT relname, coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "
        "FROM pg_stat_user_tables"
    )
    return dict(rows)


async def _turns(store: PostgresStore, observer, script) -> tuple[list[dict[str, int]], str]:
    """Rows read per table in each of TURNS turns of one conversation."""
    conversation = None
    read: list[dict[str, int]] = []
    for turn in range(TURNS):
        before = await _rows_read(store, observer)
        agent = Agent(llm=ScriptedLLM(script(turn)), tools=[note], store=store)
        result = await agent.run(f"turn {turn}", "alice", conversation)
        assert result.response == f"answer {turn}"
        conversation = result.conversation_id
        after = await _rows_read(store, observer)
        read.append({table: after[table] - before.get(table, 0) for table in after})
    return read, conversation


def _direct(turn: int) -> list[dict]:
    return [{"secure": True, "response": f"answer {turn}", "actions": []}]


def _with_tool(turn: int) -> list[dict]:
    return [{"secure": True, "response": None,
             "actions": [{"name": "note", "args": {"marker": str(turn)}}]},
            {"response": f"answer {turn}", "actions": []}]


async def test_a_late_turn_reads_as_few_rows_as_an_early_one():
    import asyncpg

    async with pgutil.fresh_database() as dsn:
        # One connection: every statement runs on it, with the plans it cached early on,
        # when the tables were small (the plans a long conversation keeps using).
        store = PostgresStore(dsn, min_size=1, max_size=1)
        observer = await asyncpg.connect(dsn)
        try:
            read, conversation = await _turns(store, observer, _direct)
            stored = await observer.fetchval(
                "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1",
                conversation)
            pool = await store._ready()
            async with pool.acquire() as db:  # the store's one connection, its statements
                plans = await db.fetch(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%conversation_messages%'")
        finally:
            await observer.close()
            await store.close()
    assert stored == 2 * TURNS  # each turn's query and answer
    # Every statement ran on its one generic plan, made once: none was planned again for
    # its parameters at each turn (the save statement was, every time, without the setting).
    assert plans and all(custom == 0 and generic >= 1 for _, generic, custom in plans), plans
    # A turn reads the rows added since the store's cached window, a few: the same at turn
    # 40 (80 messages stored) as at turn 5. A save that scanned the conversation for
    # retried message ids read all of them.
    assert max(r.get("conversation_messages", 0) for r in read[5:]) <= 4, read
    for table in read[-1]:
        assert max(r.get(table, 0) for r in read[5:]) == max(r.get(table, 0) for r in read[5:10]), (
            table, read)


async def test_a_turn_reads_none_of_the_users_other_tasks_and_conversations():
    import asyncpg

    async with pgutil.fresh_database() as dsn:
        store = PostgresStore(dsn, min_size=1, max_size=1)
        observer = await asyncpg.connect(dsn)
        try:
            for index in range(OTHERS):  # tasks left open (waiting, crashed) and old chats
                await State.start_task(f"open {index}", "alice", store=store)
                await Agent(llm=ScriptedLLM(_direct(index)), store=store).run(
                    f"old {index}", "alice")
            read, _ = await _turns(store, observer, _with_tool)
            open_tasks = await observer.fetchval(
                "SELECT count(*) FROM task_workspaces WHERE user_id = 'alice'")
        finally:
            await observer.close()
            await store.close()
    assert open_tasks == OTHERS  # the measured turns' tasks completed
    # A turn with a tool call saves three times; each save finds its task by its key. When
    # the owner check could use the user's index, each save read every task the user has
    # open: 150 rows a save here.
    for table in ("task_workspaces", "conversations", "user_profiles", "conversation_messages"):
        assert max(r.get(table, 0) for r in read) <= 12, (table, read)


async def test_a_long_conversation_new_to_a_store_is_read_whole_once():
    import asyncpg

    async with pgutil.fresh_database() as dsn:
        writer = PostgresStore(dsn)
        conversation = None
        for turn in range(150):  # 300 messages: more than one page of the window's read
            result = await Agent(llm=ScriptedLLM(_direct(turn)), store=writer).run(
                f"turn {turn}", "alice", conversation)
            conversation = result.conversation_id
        await writer.close()
        store = PostgresStore(dsn, min_size=1, max_size=1)  # another process, say
        observer = await asyncpg.connect(dsn)
        read = []
        try:
            for turn in range(150, 155):
                before = await _rows_read(store, observer)
                agent = Agent(llm=ScriptedLLM(_direct(turn)), store=store)
                result = await agent.run(f"turn {turn}", "alice", conversation)
                assert result.response == f"answer {turn}"
                assert len(agent.llm.calls[0]) == 1 + 2 * turn + 1  # the whole conversation
                after = await _rows_read(store, observer)
                read.append(after["conversation_messages"] - before["conversation_messages"])
        finally:
            await observer.close()
            await store.close()
    # The first turn reads the window (300 messages and then some); the store keeps it, so
    # the next turns read only what was added.
    assert read[0] >= 300 and max(read[1:]) <= 4, read
