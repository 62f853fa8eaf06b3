"""What the model is sent: the system prompt's parts and order, budgets, conversation window."""

from __future__ import annotations

from cogency import Agent, Memory, tool
from cogency.context import Budgets
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens


def reply(response=None, actions=(), **fields):
    return {"response": response, "actions": list(actions), **fields}


@tool
def lookup(term: str) -> str:
    """Look a term up in the glossary."""
    return f"{term}: a thing"


def _index(parts: list[str], prefix: str) -> int:
    found = [i for i, part in enumerate(parts) if part.startswith(prefix)]
    assert len(found) == 1, (prefix, parts)
    return found[0]


async def test_system_prompt_parts_in_canonical_order(store):
    await store.update_profile("ada", lambda p: p.goals.append("learn Rust"))
    llm = ScriptedLLM([
        reply(actions=[{"name": "lookup", "args": {"term": "borrow"}}], understanding="U1"),
        reply("Borrowing lends a reference."),
    ])
    learner = ScriptedLLM([{}] * 4)  # learning has its own model, off the agent's script
    agent = Agent(llm=llm, tools=[lookup], store=store, memory=Memory(llm=learner),
                  identity="You are Tutor, a patient teacher.")
    result = await agent.run("What is borrowing?", user_id="ada")
    await agent.close()
    assert result.stop_reason == "completed"

    first, second = (sent[0] for sent in llm.calls)
    assert first["role"] == second["role"] == "system"
    parts = first["content"].split("\n\n")
    order = [_index(parts, p) for p in (
        "USER CONTEXT:", "WORKSPACE:", "EXECUTION:", "TOOLS:", "You are Tutor", "SECURITY:",
        "Reply with exactly one JSON object",
    )]
    assert order == list(range(7))  # memory first, tools last of the context, blank-line joined
    assert "learn Rust" in parts[0]
    assert "objective: What is borrowing?" in parts[1]
    assert "iteration 1 of 10" in parts[2]
    assert "lookup(term: string): Look a term up in the glossary." in parts[3]
    assert '"secure": true' in parts[6]

    later = second["content"].split("\n\n")
    assert [_index(later, p) for p in ("USER CONTEXT:", "WORKSPACE:", "EXECUTION:", "TOOLS:")] \
        == [0, 1, 2, 3]
    assert "SECURITY:" not in second["content"] and '"secure"' not in second["content"]
    assert "understanding: U1" in later[1] and "recent tool results: ✓ lookup" in later[2]


async def test_without_memory_the_workspace_comes_first(store):
    llm = ScriptedLLM([reply("hi")])
    await Agent(llm=llm, store=store).run("hello")
    parts = llm.calls[0][0]["content"].split("\n\n")
    assert parts[0].startswith("WORKSPACE:") and parts[1].startswith("EXECUTION:")
    assert parts[2].startswith("TOOLS: none")


async def test_a_huge_workspace_field_is_cut_to_its_budget(store, db):
    huge = "detail " * 3000
    llm = ScriptedLLM([reply(understanding=huge), reply("done")])
    agent = Agent(llm=llm, store=store, budgets=Budgets(workspace=200))
    result = await agent.run("summarise")
    assert result.stop_reason == "completed"
    workspace_part = llm.calls[1][0]["content"].split("\n\n")[0]
    assert workspace_part.startswith("WORKSPACE:") and workspace_part.endswith("…[truncated]")
    assert count_tokens(workspace_part) <= 200


async def test_oldest_conversation_leaves_the_prompt_not_the_database(store, db):
    padding = " ".join(["filler"] * 120)
    turns = 8
    llm = ScriptedLLM([reply(f"answer {i}") for i in range(turns)], context_window=1200)
    agent = Agent(llm=llm, store=store, budgets=Budgets(output=256))
    conversation = None
    for i in range(turns):
        result = await agent.run(f"question {i} {padding}", user_id="ada",
                                 conversation_id=conversation)
        conversation = result.conversation_id

    for sent in llm.calls:  # every prompt fits the window, leaving room for the reply
        used = sum(count_tokens(m["content"]) + 8 for m in sent)
        assert used <= 1200 - 256
    last = llm.calls[-1]
    texts = [m["content"] for m in last[1:]]
    assert texts[-1].startswith(f"question {turns - 1} ")  # the newest is always there
    assert not any(t.startswith("question 0 ") for t in texts)  # the oldest left the prompt
    assert "answer 0" not in texts
    assert len(texts) < 2 * turns - 1
    # ...but not the database: every message of every turn is stored, in order.
    stored = db.execute(
        "SELECT content FROM conversation_messages WHERE conversation_id = ? ORDER BY seq",
        (conversation,),
    ).fetchall()
    assert len(stored) == 2 * turns
    assert stored[0][0].startswith("question 0 ") and stored[1][0] == "answer 0"


async def test_tool_results_count_as_rendered_against_the_window(store):
    @tool
    def page(n: int) -> str:
        """A page of a long document."""
        return f"page {n}: " + "lorem ipsum dolor sit amet " * 20

    steps = [reply(actions=[{"name": "page", "args": {"n": n}}]) for n in range(12)]
    llm = ScriptedLLM([*steps, reply("read it all")], context_window=1500)
    agent = Agent(llm=llm, tools=[page], store=store, budgets=Budgets(output=256),
                  max_iterations=20)
    result = await agent.run("read the document")
    assert result.stop_reason == "completed"
    for sent in llm.calls:
        used = sum(count_tokens(m["content"]) + 8 for m in sent)
        assert used <= 1500 - 256
    assert "page 11:" in llm.calls[-1][-1]["content"]
    assert not any("page 0:" in m["content"] for m in llm.calls[-1])
