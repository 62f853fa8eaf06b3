"""A PostgreSQL turn reads the rows it needs, not more as the conversation grows: counted
in the server's own statistics, not timed."""

from __future__ import annotations

import pgutil

from cogency import Agent
from cogency.storage import PostgresStore
from cogency.testing import ScriptedLLM

TURNS = 40


async def _rows_read(store: PostgresStore, observer) -> int:
    """Rows of conversation_messages the server has read so far (index and table scans)."""
    pool = await store._ready()
    async with pool.acquire() as db:  # the store's one connection: hand its counts over now
        await db.execute("SELECT pg_stat_force_next_flush()")
    await observer.execute("SELECT pg_stat_clear_snapshot()")
    return await observer.fetchval(
        "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "
        "FROM pg_stat_user_tables WHERE relname = 'conversation_messages'"
    )


async def test_a_late_turn_reads_as_few_message_rows_as_an_early_one():
    import asyncpg

    async with pgutil.fresh_database() as dsn:
        # One connection: every statement runs on it, with the plans it cached early on,
        # when the table was small (the plans a long conversation keeps using).
        store = PostgresStore(dsn, min_size=1, max_size=1)
        observer = await asyncpg.connect(dsn)
        conversation = None
        read: list[int] = []
        try:
            for turn in range(TURNS):
                before = await _rows_read(store, observer)
                agent = Agent(llm=ScriptedLLM([{"secure": True, "response": f"answer {turn}",
                                                "actions": []}]), store=store)
                result = await agent.run(f"turn {turn}", "alice", conversation)
                assert result.response == f"answer {turn}"
                conversation = result.conversation_id
                read.append(await _rows_read(store, observer) - before)
            stored = await observer.fetchval(
                "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1",
                conversation)
        finally:
            await observer.close()
            await store.close()
    assert stored == 2 * TURNS  # each turn's query and answer
    # A turn reads the rows added since the store's cached window, a few: the same at turn
    # 40 (80 messages stored) as at turn 5. A save that scanned the conversation for
    # retried message ids read all of them.
    assert max(read[5:]) <= 4, read
