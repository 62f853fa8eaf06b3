"""Tenant isolation as a property: random interleavings of users, conversations and tasks
through the public APIs; no operation by one user ever returns or changes another's data.
``COGENCY_FUZZ_SCALE`` scales the number of interleavings."""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cogency import Agent, tool
from cogency.errors import LLMError, NotFoundError
from cogency.memory import Memory
from cogency.state import State
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM

USERS = ("alice", "bob", "carol")
SCALE = float(os.environ.get("COGENCY_FUZZ_SCALE", "1"))


@tool
def echo(text: str) -> str:
    """Say the text back."""
    return text


@dataclass
class World:
    """What each user should see: the model the store is checked against."""

    conversations: dict[str, str] = field(default_factory=dict)  # id -> owner
    messages: dict[str, int] = field(default_factory=dict)  # conversation -> count
    tasks: dict[str, str] = field(default_factory=dict)  # unfinished task -> owner
    task_conversation: dict[str, str] = field(default_factory=dict)
    goals: dict[str, list[str]] = field(default_factory=dict)
    serial: int = 0

    def pick(self, items: list[str], index: int) -> str | None:
        return items[index % len(items)] if items else None


ops = st.lists(
    st.tuples(
        st.sampled_from(["run", "run_in", "unfinished", "resume", "continue", "read",
                         "list", "learn", "forget"]),
        st.sampled_from(USERS),
        st.integers(0, 50),
    ),
    min_size=1,
    max_size=18,
)


async def _apply(store: SQLiteStore, world: World, op: str, user: str, index: int) -> None:
    world.serial += 1
    tag = f"{user}#{world.serial}"
    conversation = world.pick(sorted(world.conversations), index)
    task = world.pick(sorted(world.tasks), index)
    answer = {"secure": True, "response": f"reply for {tag}", "actions": []}
    if op in ("run", "run_in", "unfinished"):
        target = conversation if op != "run" else None
        llm = ScriptedLLM([answer] if op != "unfinished" else [
            {"secure": True, "actions": [{"name": "echo", "args": {"text": tag}}]},
            LLMError("down"),
        ])
        agent = Agent(llm=llm, tools=[echo], store=store, llm_retries=0)
        if target is not None and world.conversations[target] != user:
            try:
                await agent.run(f"query {tag}", user_id=user, conversation_id=target)
            except NotFoundError:
                return
            raise AssertionError(f"{user} wrote into {world.conversations[target]}'s conversation")
        result = await agent.run(f"query {tag}", user_id=user, conversation_id=target)
        world.conversations[result.conversation_id] = user
        world.messages[result.conversation_id] = world.messages.get(result.conversation_id, 0) + (
            2 if op != "unfinished" else 3)
        if op == "unfinished":
            assert result.stop_reason == "error"
            world.tasks[result.task_id] = user
            world.task_conversation[result.task_id] = result.conversation_id
    elif op in ("resume", "continue") and task is not None:
        owner = world.tasks[task]
        if op == "continue":
            try:
                state = await State.continue_task(task, user, store)
            except NotFoundError:
                assert owner != user
                return
            assert owner == user and state.user_id == user
            assert all(_mine(m["content"], user) for m in state.conversation.messages)
            return
        agent = Agent(llm=ScriptedLLM([answer]), tools=[echo], store=store)
        try:
            result = await agent.resume(task, user_id=user)
        except NotFoundError:
            assert owner != user
            return
        assert owner == user and result.stop_reason == "completed"
        del world.tasks[task]
        world.messages[world.task_conversation[task]] += 1
    elif op == "read" and conversation is not None:
        try:
            rows = await store.load_messages(conversation, user)
        except NotFoundError:
            assert world.conversations[conversation] != user
            return
        assert world.conversations[conversation] == user
        assert all(_mine(m["content"], user) for m in rows)
    elif op == "list":
        pass  # the invariant below lists everything for everyone
    elif op == "learn":
        await store.update_profile(user, lambda p: p.goals.append(f"goal of {tag}"))
        world.goals.setdefault(user, []).append(f"goal of {tag}")
    elif op == "forget":
        await Memory(store=store).forget(user)
        for key in [c for c, owner in world.conversations.items() if owner == user]:
            del world.conversations[key]
            world.messages.pop(key, None)
        for key in [t for t, owner in world.tasks.items() if owner == user]:
            del world.tasks[key]
        world.goals.pop(user, None)


def _mine(text: str, user: str) -> bool:
    """Every message names only its owner (queries, tool calls, results and replies)."""
    return all(other not in text for other in USERS if other != user)


async def _check(store: SQLiteStore, world: World) -> None:
    for user in USERS:
        conversations = {c.conversation_id for c in await store.list_conversations(user)}
        assert conversations == {c for c, owner in world.conversations.items() if owner == user}
        for conversation in conversations:
            rows = await store.load_messages(conversation, user)
            assert len(rows) == world.messages[conversation]
            assert all(_mine(m["content"], user) for m in rows), rows
        tasks = {t.task_id for t in await store.list_tasks(user)}
        assert tasks == {t for t, owner in world.tasks.items() if owner == user}
        profile = await store.load_profile(user)
        goals = profile.goals if profile is not None else []
        assert goals == world.goals.get(user, [])[-10:]


@settings(max_examples=max(1, int(60 * SCALE)), deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(ops)
def test_no_operation_of_one_user_reaches_another_users_data(sequence) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            store = SQLiteStore(Path(directory) / "tenants.db")
            world = World()
            try:
                for op, user, index in sequence:
                    await _apply(store, world, op, user, index)
                    await _check(store, world)
            finally:
                await store.close()

    asyncio.run(main())
