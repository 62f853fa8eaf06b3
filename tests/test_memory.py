"""Situated memory through the public API: learning after each task, the user context in the
next prompt, consolidation, background learning, failures, concurrency and forgetting.

Every test runs ``Agent.run`` with a ``ScriptedLLM`` and looks at the database rows and at the
prompts the model was sent. Learning gets its own ScriptedLLM so the agent's script stays
predictable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from memory_replies import answer, insights, learn_into

from cogency import Agent
from cogency.memory import ImpressionSynthesizer, Memory, Profile
from cogency.memory.profile import MAX_GOALS, MAX_PREFERENCES, MAX_TEXT
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens


def profile_row(db: sqlite3.Connection, user_id: str) -> dict[str, Any] | None:
    row = db.execute(
        "SELECT profile_data FROM user_profiles WHERE user_id = ?", (user_id,)
    ).fetchone()
    return None if row is None else json.loads(row[0])


def system_of(call: list[dict[str, Any]]) -> str:
    assert call[0]["role"] == "system"
    return call[0]["content"]


class SchemaRecorder(ScriptedLLM):
    """A ScriptedLLM that also keeps the ``schema`` of each call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schemas: list[dict[str, Any] | None] = []

    async def generate(self, messages, *, schema=None):  # type: ignore[no-untyped-def]
        self.schemas.append(schema)
        return await super().generate(messages, schema=schema)


# -- learning and activation --------------------------------------------------------------------


async def test_task_teaches_the_profile_and_next_prompt_starts_with_it(store, db) -> None:
    learner = SchemaRecorder([
        insights(
            preferences={"language": "Rust"}, goals=["ship a CLI"], communication_style="concise",
            project_context={"rcli": "a Rust command line tool"},
        ),
        insights(),
        insights(goals=["bob's goal"]),
    ])
    llm = ScriptedLLM([answer("Use clap."), answer("Sure."), answer("Hello Bob.")])
    agent = Agent(llm=llm, store=store, memory=Memory(llm=learner))

    first = await agent.run("I write Rust; how do I parse CLI args? Keep it short.", "alice")
    assert first.stop_reason == "completed" and first.response == "Use clap."
    assert not system_of(llm.calls[0]).startswith("USER CONTEXT:")  # nothing known yet
    await agent.memory.settle()

    row = profile_row(db, "alice")
    assert row["preferences"] == {"language": "Rust"}
    assert row["goals"] == ["ship a CLI"]
    assert row["communication_style"] == "concise"
    assert row["projects"] == {"rcli": "a Rust command line tool"}
    assert row["interaction_count"] == 1 and row["synthesis_version"] == 1
    # One learning call, sent the query, the answer and the task's conversation, with a schema.
    prompt = learner.calls[0][0]["content"]
    assert "how do I parse CLI args" in prompt and "Use clap." in prompt
    assert "assistant: Use clap." in prompt
    assert set(learner.schemas[0]["required"]) >= {"preferences", "goals", "expertise"}

    await agent.run("And subcommands?", "alice")
    system = system_of(llm.calls[1])
    assert system.startswith("USER CONTEXT:")
    assert "language: Rust" in system and "ship a CLI" in system and "concise" in system

    await agent.run("Hi, I'm Bob", "bob")
    assert "USER CONTEXT" not in system_of(llm.calls[2])
    assert "Rust" not in json.dumps(llm.calls[2])
    await agent.close()
    assert profile_row(db, "bob")["goals"] == ["bob's goal"]
    assert "Rust" not in json.dumps(profile_row(db, "bob"))


async def test_a_new_agent_in_a_fresh_process_sees_the_profile(store, db, db_path: Path) -> None:
    learner = ScriptedLLM([insights(preferences={"editor": "helix"}, goals=["learn Zig"])])
    async with Agent(llm=ScriptedLLM([answer()]), store=store, memory=Memory(llm=learner)) as a:
        await a.run("I use helix and I'm learning Zig", "alice")
    assert profile_row(db, "alice")["goals"] == ["learn Zig"]

    script = textwrap.dedent("""
        import asyncio, json, sys
        from cogency import Agent, Memory
        from cogency.storage import SQLiteStore
        from cogency.testing import ScriptedLLM

        async def main():
            reply = {"secure": True, "response": "ok", "actions": []}
            llm = ScriptedLLM([reply, reply])
            store = SQLiteStore(sys.argv[1])
            learner = ScriptedLLM([{"goals": []}, {"goals": []}])
            async with Agent(llm=llm, store=store, memory=Memory(llm=learner)) as agent:
                await agent.run("what was I learning?", user_id="alice")
                await agent.run("who am I?", user_id="carol")
            await store.close()
            print(json.dumps([llm.calls[0][0], llm.calls[1][0]]))

        asyncio.run(main())
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, str(db_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    alice, carol = json.loads(done.stdout)
    assert alice["role"] == "system" and alice["content"].startswith("USER CONTEXT:")
    assert "learn Zig" in alice["content"] and "editor: helix" in alice["content"]
    assert "USER CONTEXT" not in carol["content"] and "Zig" not in carol["content"]


async def test_memory_true_learns_with_the_agents_model(store, db) -> None:
    llm = ScriptedLLM([answer("hi"), insights(interests=["astronomy"])])
    async with Agent(llm=llm, store=store, memory=True) as agent:
        await agent.run("Tell me about Jupiter's moons", "alice")
    assert len(llm.calls) == 2 and "Jupiter" in llm.calls[1][0]["content"]
    assert profile_row(db, "alice")["interests"] == ["astronomy"]


async def test_user_context_stays_within_its_token_budget(store, db) -> None:
    many = insights(
        goals=[f"goal number {i} " + "x" * 40 for i in range(50)],
        preferences={f"pref{i}": "y" * 100 for i in range(40)},
        expertise=[f"area {i}" for i in range(30)],
        communication_style="z" * 10_000,
    )
    learner = ScriptedLLM([many, insights()])
    llm = ScriptedLLM([answer(), answer()])
    async with Agent(
        llm=llm, store=store, memory=Memory(llm=learner, profile_tokens=60)
    ) as agent:
        await agent.run("first", "alice")
        await agent.memory.settle()
        await agent.run("second", "alice")

    row = profile_row(db, "alice")
    assert len(row["goals"]) == MAX_GOALS and row["goals"][-1].startswith("goal number 49")
    assert row["goals"][0].startswith("goal number 40")
    assert len(row["preferences"]) == MAX_PREFERENCES and "pref39" in row["preferences"]
    assert len(row["expertise_areas"]) == 15
    assert len(row["communication_style"]) == MAX_TEXT
    Profile.from_dict(row)  # the stored row is a valid profile
    memory_part = system_of(llm.calls[1]).split("\n\n")[0]
    assert memory_part.startswith("USER CONTEXT:") and count_tokens(memory_part) <= 60


# -- consolidation ------------------------------------------------------------------------------


async def test_third_interaction_consolidates_and_newer_fact_wins(store, db) -> None:
    learner = ScriptedLLM([
        insights(preferences={"language": "Python"}, goals=["build a Python web app"]),
        insights(preferences={"switched_to": "Rust"}, goals=["port the web app to Rust"]),
        insights(communication_style="terse"),
        {  # the consolidation: the contradiction resolved in favour of the newer fact
            "preferences": [{"key": "language", "value": "Rust"}],
            "goals": ["port the web app to Rust"], "expertise_areas": [],
            "communication_style": "", "projects": [], "interests": [], "constraints": [],
            "success_patterns": [], "failure_patterns": [],
        },
        insights(),
    ])
    llm = ScriptedLLM([answer()] * 4)
    async with Agent(llm=llm, store=store, memory=Memory(llm=learner)) as agent:
        for number, query in enumerate(
            ["I prefer Python for web apps", "I switched to Rust", "Keep it terse"], 1
        ):
            await agent.run(query, "alice")
            await agent.memory.settle()
            row = profile_row(db, "alice")
            assert row["interaction_count"] == number
            assert row["synthesis_version"] == (2 if number == 3 else 1)
        assert len(learner.calls) == 4  # three extractions and one consolidation

        consolidation = learner.calls[3][0]["content"]
        # The whole profile went to the model, older facts before newer ones.
        assert consolidation.index("Python") < consolidation.index("Rust")
        row = profile_row(db, "alice")
        assert row["preferences"] == {"language": "Rust"}
        assert row["goals"] == ["port the web app to Rust"]
        assert row["communication_style"] == "terse"  # left empty by the reply: kept
        learned = {k: row[k] for k in Profile(user_id="x").learned()}
        assert "Python" not in json.dumps(learned)

        await agent.run("What should I use?", "alice")
        system = system_of(llm.calls[3])
        assert "language: Rust" in system and "Python" not in system


async def test_failed_consolidation_keeps_insights_and_is_made_up_next_time(
    store, db, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="cogency.memory")
    learner = ScriptedLLM([
        insights(goals=["a"]), insights(goals=["b"]), insights(goals=["c"]),
        "I cannot produce JSON today",  # the consolidation breaks
        insights(goals=["d"]),
        {"goals": ["c", "d"]},  # owed consolidation, made with the fourth interaction
    ])
    memory = Memory(llm=learner, retry_delay=0)
    async with Agent(llm=ScriptedLLM([answer()] * 4), store=store, memory=memory) as agent:
        for query in ("one", "two", "three"):
            await agent.run(query, "alice")
            await agent.memory.settle()
        row = profile_row(db, "alice")
        assert row["goals"] == ["a", "b", "c"] and row["interaction_count"] == 3
        assert row["synthesis_version"] == 1
        assert "consolidating the profile of user 'alice' failed" in caplog.text
        await agent.run("four", "alice")
    row = profile_row(db, "alice")
    assert row["interaction_count"] == 4 and row["synthesis_version"] == 2
    assert row["goals"] == ["c", "d"]
    assert len(learner.calls) == 6  # nothing was extracted twice


async def test_consolidation_made_from_a_stale_profile_is_dropped(store) -> None:
    await store.update_profile("alice", lambda p: learn_into(p, {"goals": ["a"]}))
    stale = await store.load_profile("alice")
    await store.update_profile("alice", lambda p: learn_into(p, {"goals": ["b"]}))
    synth = ImpressionSynthesizer(ScriptedLLM([{"goals": ["only a"]}]), store)
    kept = await synth.synthesize("alice", stale)
    assert kept.goals == ["a", "b"] and kept.synthesis_version == 1
    assert (await store.load_profile("alice")).goals == ["a", "b"]


# -- background learning ------------------------------------------------------------------------


async def test_run_returns_while_learning_is_blocked_and_close_finishes_it(store, db) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_learning(messages: list[dict[str, Any]]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return insights(goals=["finish the thesis"])

    agent = Agent(
        llm=ScriptedLLM([answer("Here you go.")]), store=store,
        memory=Memory(llm=ScriptedLLM([slow_learning])),
    )
    result = await asyncio.wait_for(agent.run("Help with my thesis", "alice"), 10)
    assert result.stop_reason == "completed" and result.response == "Here you go."
    await asyncio.wait_for(started.wait(), 10)  # learning is under way, and blocked
    assert agent.memory.pending == 1
    assert profile_row(db, "alice")["goals"] == []

    closing = asyncio.create_task(agent.close())
    await asyncio.sleep(0)
    assert not closing.done()  # close waits for the learning
    release.set()
    await asyncio.wait_for(closing, 10)
    assert profile_row(db, "alice")["goals"] == ["finish the thesis"]
    assert agent.memory.pending == 0


async def test_close_gives_up_after_its_time_limit_without_raising(store, db, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cogency.memory")
    never = asyncio.Event()

    async def stuck(messages: list[dict[str, Any]]) -> dict[str, Any]:
        await never.wait()
        return insights(goals=["never"])

    memory = Memory(llm=ScriptedLLM([stuck]), settle_timeout=0.2)
    started = time.monotonic()
    async with Agent(llm=ScriptedLLM([answer()]), store=store, memory=memory) as agent:
        result = await agent.run("hello", "alice")
    assert result.stop_reason == "completed"
    assert time.monotonic() - started < 5
    assert "still running after 0.2 s; cancelling" in caplog.text
    row = profile_row(db, "alice")
    assert row["goals"] == [] and row["interaction_count"] == 0
    # not lost: still queued, and let go, for the next process with memory on
    (queued,) = db.execute("SELECT tasks, claimed, holder FROM learning_queue").fetchall()
    assert json.loads(queued[0])[0]["task_id"] == result.task_id
    assert queued[1:] == ("[]", None)


async def test_a_close_that_cancels_a_claim_in_flight_lets_it_go(db_path: Path, db) -> None:
    # The store claims the queued task, but the worker that asked is cancelled (a settle past
    # its time limit) before the claim reaches it: the claim is let go, not left held until
    # its lease lapses, so the next process learns it at once.
    claimed = asyncio.Event()

    class SlowClaims(SQLiteStore):
        async def claim_learning(self, *args: Any, **options: Any) -> Any:
            claims = await super().claim_learning(*args, **options)
            claimed.set()
            await asyncio.sleep(0.1)  # the settle's cancellation lands here
            return claims

    store = SlowClaims(db_path)
    try:
        async with Agent(llm=ScriptedLLM([answer()]), store=store,
                         memory=Memory(llm=ScriptedLLM([insights(goals=["x"])]),
                                       settle_timeout=0)) as agent:
            result = await agent.run("hello", "alice")
            await asyncio.wait_for(claimed.wait(), 10)
    finally:
        await store.close()
    (queued,) = db.execute("SELECT tasks, claimed, holder FROM learning_queue").fetchall()
    assert [task["task_id"] for task in json.loads(queued[0])] == [result.task_id]
    assert queued[1:] == ("[]", None)
    later = SQLiteStore(db_path)
    memory = Memory(store=later, llm=ScriptedLLM([insights(goals=["learned later"])]))
    try:
        assert await memory.catch_up() == 1
        assert await memory.settle()
    finally:
        await memory.close()
        await later.close()
    assert profile_row(db, "alice")["goals"] == ["learned later"]


def test_run_sync_finishes_pending_learning(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    # Learning takes longer than the run: asyncio.run would cancel it if run_sync did not wait.
    learner = ScriptedLLM([insights(goals=["sync goal"])], delay=0.05)
    agent = Agent(llm=ScriptedLLM([answer()]), store=store, memory=Memory(llm=learner))
    assert agent.run_sync("remember this", "alice").stop_reason == "completed"
    asyncio.run(agent.close())
    asyncio.run(store.close())
    connection = sqlite3.connect(db_path)
    try:
        assert profile_row(connection, "alice")["goals"] == ["sync goal"]
    finally:
        connection.close()


# -- failures never break a run or the profile --------------------------------------------------


async def test_malformed_learning_reply_is_retried(store, db, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cogency.memory")
    learner = ScriptedLLM([
        "Sure! Here are the insights: none",
        '```json\n{"goals": ["tolerant parse"],\n'
        ' "preferences": [{"key": "tabs", "value": "no"},],}\n```',
    ])
    async with Agent(
        llm=ScriptedLLM([answer("ok")]), store=store, memory=Memory(llm=learner, retry_delay=0)
    ) as agent:
        result = await agent.run("hi", "alice")
    assert result.response == "ok"
    row = profile_row(db, "alice")
    assert row["goals"] == ["tolerant parse"] and row["preferences"] == {"tabs": "no"}
    assert row["interaction_count"] == 1
    assert "attempt 1 of 3" in caplog.text and "no JSON object" in caplog.text


async def test_wrongly_typed_insights_leave_a_valid_profile(store, db) -> None:
    learner = ScriptedLLM([
        {"goals": 5, "preferences": "dark mode", "expertise": [1, None, {"a": 1}, "SQL"],
         "communication_style": ["not", "a", "string"], "project_context": [["x"], "y"],
         "success_pattern": {"no": "dict"}, "unexpected": True},
    ])
    async with Agent(
        llm=ScriptedLLM([answer()]), store=store, memory=Memory(llm=learner)
    ) as agent:
        await agent.run("hi", "alice")
    row = profile_row(db, "alice")
    profile = Profile.from_dict(row)
    assert profile.expertise_areas == ["1", "SQL"] and profile.goals == []
    assert profile.preferences == {} and profile.projects == {}
    assert profile.communication_style == "" and profile.success_patterns == []
    assert row["interaction_count"] == 1


async def test_failing_learning_model_keeps_the_task_queued_and_learns_it_with_the_next(
    store, db, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="cogency.memory")
    down = RuntimeError("provider down")
    learner = ScriptedLLM([
        down, down, down,  # the first interaction: every attempt fails
        insights(goals=["from task one", "from task two"]),  # both, learned together
    ])
    memory = Memory(llm=learner, retry_delay=0, learn_retries=2)
    llm = ScriptedLLM([answer("first answer"), answer("second answer")])
    async with Agent(llm=llm, store=store, memory=memory) as agent:
        result = await agent.run("task one", "alice")
        assert result.stop_reason == "completed" and result.response == "first answer"
        await agent.memory.settle()
        row = profile_row(db, "alice")
        assert row["goals"] == [] and row["interaction_count"] == 0
        assert caplog.text.count("provider down") == 3
        # Kept in the store, visible, and what failed is said.
        status = await agent.memory.status("alice")
        assert status.pending == 1 and status.attempts == 1
        assert "provider down" in status.last_error
        (queued,) = db.execute("SELECT tasks, attempts FROM learning_queue").fetchall()
        assert json.loads(queued[0])[0]["task_id"] == result.task_id and queued[1] == 1

        second = await agent.run("task two", "alice")  # due again at once, with the new task
        assert second.response == "second answer"
    row = profile_row(db, "alice")
    assert row["goals"] == ["from task one", "from task two"]
    assert row["interaction_count"] == 2  # two interactions, one extraction call
    prompt = learner.calls[3][0]["content"]
    assert prompt.index("task one") < prompt.index("task two")  # oldest first
    assert prompt.count("<interaction>") == 2
    assert db.execute("SELECT COUNT(*) FROM learning_queue").fetchone() == (0,)


async def test_failed_task_is_not_learned(store, db) -> None:
    learner = ScriptedLLM([])
    async with Agent(
        llm=ScriptedLLM(["not json"] * 3), store=store, memory=Memory(llm=learner),
        invalid_retries=2,
    ) as agent:
        result = await agent.run("hi", "alice")
    assert result.stop_reason == "invalid_response"
    assert learner.calls == [] and profile_row(db, "alice")["interaction_count"] == 0


# -- concurrency ----------------------------------------------------------------------------------


async def test_two_concurrent_tasks_of_one_user_are_learned_once_each(store, db) -> None:
    active = peak = 0
    learned: list[str] = []

    async def respond(messages: list[dict[str, Any]]) -> dict[str, Any]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)  # room for another call of this user to start (none may)
        active -= 1
        # The interactions to learn, after the profile block (which quotes a task learned
        # before, when the two are learned one after the other).
        prompt = messages[0]["content"].split("</profile>", 1)[-1]
        found = [q for q in ("task A", "task B") if q in prompt]
        learned.extend(found)
        return insights(goals=found, interests=found)

    learner = ScriptedLLM([respond, respond])
    llm = ScriptedLLM([answer(), answer()])
    async with Agent(llm=llm, store=store, memory=Memory(llm=learner)) as agent:
        results = await asyncio.gather(agent.run("task A", "alice"), agent.run("task B", "alice"))
    assert [r.stop_reason for r in results] == ["completed", "completed"]
    row = profile_row(db, "alice")
    assert sorted(row["goals"]) == ["task A", "task B"] and row["interaction_count"] == 2
    assert sorted(learned) == ["task A", "task B"]  # each learned once (together or not)
    assert peak == 1  # one user's learning is one worker at a time
    assert agent.memory._working == {}  # workers are dropped when idle


async def test_two_agents_on_one_store_learn_each_task_exactly_once(store, db) -> None:
    gate = asyncio.Event()
    arrived = asyncio.Event()

    async def held(messages: list[dict[str, Any]]) -> dict[str, Any]:
        arrived.set()
        await gate.wait()
        prompt = messages[0]["content"]
        return insights(goals=[q for q in ("query one", "query two") if q in prompt])

    learners = [ScriptedLLM([held, held]), ScriptedLLM([held, held])]
    agents = [Agent(llm=ScriptedLLM([answer()]), store=store, memory=Memory(llm=learner))
              for learner in learners]
    await agents[0].run("query one", "alice")
    await asyncio.wait_for(arrived.wait(), 10)  # agent one is learning "one", claimed
    await agents[1].run("query two", "alice")  # queued behind that claim
    await asyncio.sleep(0.1)
    gate.set()
    await asyncio.gather(*(agent.close() for agent in agents))
    row = profile_row(db, "alice")
    assert sorted(row["goals"]) == ["query one", "query two"]
    assert row["interaction_count"] == 2
    prompts = [call[0]["content"] for learner in learners for call in learner.calls]
    # Each task reached exactly one extraction that was stored: no task twice.
    assert sorted(q for p in prompts for q in ("query one", "query two")
                  if f"Query: {q}" in p) == ["query one", "query two"]
    assert db.execute("SELECT COUNT(*) FROM learning_queue").fetchone() == (0,)


# -- forgetting -----------------------------------------------------------------------------------


def all_rows(db: sqlite3.Connection) -> dict[str, list[tuple]]:
    tables = [
        name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return {table: db.execute(f'SELECT * FROM "{table}"').fetchall() for table in tables}


async def test_forget_removes_every_row_of_the_user_only(store, db) -> None:
    learner = ScriptedLLM([insights(goals=["alice secret goal"]), insights(goals=["bob goal"])])
    llm = ScriptedLLM([
        answer("answer for alice"),
        {"secure": True, "response": None, "actions": []},  # alice's second task never ends
        answer("answer for bob"),
    ])
    agent = Agent(llm=llm, store=store, memory=Memory(llm=learner), max_iterations=1)
    done = await agent.run("alice-query-one", "alice")
    unfinished = await agent.run("alice-query-two", "alice", done.conversation_id)
    assert unfinished.stop_reason == "max_iterations"
    bob = await agent.run("bob-query", "bob")
    await agent.close()

    before = all_rows(db)
    assert any("alice-query-two" in repr(row) for row in before["task_workspaces"])
    assert len(before["conversation_messages"]) >= 4

    await Memory(store=store).forget("alice")

    marks = ["'alice'", done.conversation_id, unfinished.task_id, "alice-query",
             "answer for alice", "alice secret goal"]
    after = all_rows(db)
    for table, rows in after.items():
        for row in rows:
            for mark in marks:
                assert mark not in repr(row), f"{table} still holds {mark}: {row}"
    assert profile_row(db, "bob")["goals"] == ["bob goal"]
    bob_messages = db.execute(
        "SELECT content FROM conversation_messages WHERE conversation_id = ?",
        (bob.conversation_id,),
    ).fetchall()
    assert ("bob-query",) in bob_messages and ("answer for bob",) in bob_messages


async def test_forget_while_learning_is_pending_writes_nothing_back(store, db) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(messages: list[dict[str, Any]]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return insights(goals=["should be forgotten"])

    agent = Agent(llm=ScriptedLLM([answer()]), store=store, memory=Memory(llm=ScriptedLLM([slow])))
    await agent.run("hi", "alice")
    await asyncio.wait_for(started.wait(), 10)
    await agent.memory.forget("alice")
    release.set()
    await agent.close()
    assert all(
        "alice" not in repr(row) for rows in all_rows(db).values() for row in rows
    )


async def test_memory_without_a_model_says_what_to_pass(store) -> None:
    with pytest.raises(ValueError, match="Memory\\(llm=...\\)"):
        await Memory(store=store).learn("alice", {"query": "q"})


# -- every backend ------------------------------------------------------------------------------


async def test_learning_and_forgetting_on_every_backend(any_store, raw) -> None:
    async def stored(user_id: str) -> dict[str, Any] | None:
        rows = await raw("SELECT profile_data FROM user_profiles WHERE user_id = ?", user_id)
        if not rows:
            return None
        data = rows[0][0]
        return json.loads(data) if isinstance(data, str) else data

    started, release = asyncio.Event(), asyncio.Event()

    async def slow(messages: list[dict[str, Any]]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return insights(goals=["written after forget"])

    learner = ScriptedLLM([insights(goals=["a"]), slow])
    agent = Agent(llm=ScriptedLLM([answer(), answer()]), store=any_store,
                  memory=Memory(llm=learner))
    await agent.run("first", "alice")
    await agent.memory.settle()
    assert (await stored("alice"))["goals"] == ["a"]

    # A consolidation made from a stale profile is rolled back, not written over newer insights.
    stale = await any_store.load_profile("alice")
    await any_store.update_profile("alice", lambda p: learn_into(p, {"goals": ["b"]}))
    synth = ImpressionSynthesizer(ScriptedLLM([{"goals": ["only a"]}]), any_store)
    assert (await synth.synthesize("alice", stale)).goals == ["a", "b"]
    assert (await stored("alice"))["goals"] == ["a", "b"]

    # Forgetting while learning is in flight: the learning must not write the profile back.
    await agent.run("second", "alice")
    await asyncio.wait_for(started.wait(), 10)
    await agent.memory.forget("alice")
    release.set()
    await agent.close()
    assert await stored("alice") is None
    assert await raw("SELECT conversation_id FROM conversations WHERE user_id = ?", "alice") == []
