"""PostgresStore behind PgBouncer (Debian's 1.18, started by the tests): it finds the pooler
and works through it in transaction and session mode, costs the same round trips per turn,
keeps no session state a run depends on, and says clearly what a pooler it cannot work
with (statement mode) must change."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pgutil
import pytest

from cogency import Agent, tool
from cogency.errors import ConfigurationError
from cogency.storage import PostgresStore
from cogency.testing import ScriptedLLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def reply(response=None, actions=()):
    return {"secure": True, "response": response, "actions": list(actions)}


@tool
def note(marker: str) -> str:
    """Note a marker."""
    return f"noted {marker}"


async def _conversation(store: PostgresStore, turns: int) -> list[str]:
    conversation, answers = None, []
    for turn in range(turns):
        llm = ScriptedLLM([reply(actions=[{"name": "note", "args": {"marker": str(turn)}}]),
                           reply(f"answer {turn}")])
        result = await Agent(llm=llm, tools=[note], store=store).run(
            f"turn {turn}", "alice", conversation)
        conversation = result.conversation_id
        answers.append(result.response)
    return answers


@pytest.mark.parametrize("mode", ["transaction", "session"])
async def test_a_store_behind_pgbouncer_finds_it_and_works(mode):
    bouncer = pgutil.pgbouncer(mode)
    async with pgutil.fresh_store(as_app=True, port=bouncer.port) as store:
        assert await _conversation(store, 3) == ["answer 0", "answer 1", "answer 2"]
        assert store.pooled is True  # PgBouncer refused plan_cache_mode at start-up
        rows = await pgutil.raw_rows(store)("SELECT role FROM conversation_messages")
        assert len(rows) == 3 * 4
    async with pgutil.fresh_store(as_app=True) as direct:
        await _conversation(direct, 1)
        assert direct.pooled is False


async def test_memory_learns_exports_and_forgets_through_pgbouncer():
    """Memory's statements (the completion that queues learning, the claim, the entries, an
    export's snapshot) keep no session state either."""
    from memory_replies import answer, insights

    from cogency import Memory

    bouncer = pgutil.pgbouncer("transaction")
    async with pgutil.fresh_store(as_app=True, port=bouncer.port) as store:
        learner = ScriptedLLM([insights(goals=["sail"])])
        async with Agent(llm=ScriptedLLM([answer("ahoy")]), store=store,
                         memory=Memory(llm=learner)) as agent:
            await agent.run("I want to sail", "alice")
            await agent.memory.settle()
        memory = Memory(store=store)
        [goal] = await memory.entries("alice")
        assert goal.value == "sail" and goal.sources[0]["message_ids"]
        document = await memory.export_user("alice")
        assert [e["value"] for e in document["entries"]] == ["sail"]
        receipt = await memory.forget("alice")
        assert (receipt.entries, receipt.conversations, receipt.pending_learning) == (1, 1, 0)
        await memory.import_user(document)
        assert [e.value for e in await memory.entries("alice")] == ["sail"]
        assert store.pooled is True


async def test_a_pooler_that_passes_startup_settings_on_is_found_by_its_first_miss():
    """A pooler that accepts plan_cache_mode but hands each transaction another server
    connection: a statement prepared on one is missing on the next. The store's statement
    names are its own, so the miss is an error before anything ran (never another client's
    statement of the same name); the store turns to unnamed statements and goes on."""
    bouncer = pgutil.PgBouncer("transaction", pool_size=4,
                               extra="ignore_startup_parameters = plan_cache_mode\n")
    try:
        async with pgutil.fresh_store(as_app=True, port=bouncer.port) as store:
            await store.list_tasks()
            assert store.pooled is False  # accepted: it looks direct at first
            results = await asyncio.gather(*(
                Agent(llm=ScriptedLLM([reply(f"answer {n}")]), store=store).run(
                    f"q{n}", f"user{n % 3}") for n in range(24)))
            assert sorted(r.response for r in results) == sorted(f"answer {n}" for n in range(24))
            assert store.pooled is True
            rows = await pgutil.raw_rows(store)(
                "SELECT count(*) FROM conversation_messages")
            assert rows == [(48,)]
    finally:
        bouncer.stop()


async def test_statement_pooling_is_refused_with_what_to_change():
    bouncer = pgutil.PgBouncer("statement")
    try:
        async with pgutil.fresh_database(as_app=True, port=bouncer.port) as dsn:
            store = PostgresStore(dsn)
            with pytest.raises(ConfigurationError, match="pool_mode = transaction"):
                await store.list_tasks()
            await store.close()
    finally:
        bouncer.stop()


async def test_a_one_step_turn_is_two_round_trips_through_pgbouncer():
    from bench.bench_postgres import round_trips

    bouncer = pgutil.pgbouncer("transaction")
    async with pgutil.fresh_database(as_app=True, port=bouncer.port) as dsn:
        assert await round_trips(dsn) == {"begin_task": 1, "save": 1, "total": 2}


async def test_the_readmes_pgbouncer_settings_work():
    """The example configuration of the README's "Serving at scale": its [pgbouncer]
    settings (its address and authentication aside, which are the test's) carry runs."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    example = readme.split("```ini\n", 1)[1].split("```", 1)[0]
    settings = example.split("[pgbouncer]\n", 1)[1]
    kept = "".join(line + "\n" for line in settings.splitlines()
                   if line.strip() and not line.startswith(("listen_", "auth_")))
    assert "pool_mode = transaction" in kept
    bouncer = pgutil.PgBouncer("transaction", extra=kept)
    try:
        async with pgutil.fresh_store(as_app=True, port=bouncer.port) as store:
            assert await _conversation(store, 2) == ["answer 0", "answer 1"]
            assert store.pooled is True
    finally:
        bouncer.stop()


async def test_a_pooler_out_of_client_slots_says_which_setting_to_raise():
    bouncer = pgutil.PgBouncer("transaction", max_clients=1)
    try:
        async with pgutil.fresh_database(as_app=True, port=bouncer.port) as dsn:
            first = PostgresStore(dsn, min_size=1, max_size=1)
            second = PostgresStore(dsn, min_size=1, max_size=1)
            try:
                await first.list_tasks()  # takes PgBouncer's only client slot
                with pytest.raises(ConfigurationError, match="max_client_conn"):
                    await second.list_tasks()
            finally:
                await first.close()
                await second.close()
    finally:
        bouncer.stop()
