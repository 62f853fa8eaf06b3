"""Does the profile remember what is true now, and forget what no longer is?

A fixed set of multi-session conversations (:data:`SCENARIOS`): facts are stated, then
corrected or contradicted in later sessions (each session a new conversation, so only the
profile carries facts across). Then questions whose answers need the profile. Reported, per
scenario and in all:

- **profile recall**: questions whose right answer is in the prompt's ``USER CONTEXT``;
- **wrong facts held**: questions whose superseded answer is still in it;
- **answers right** (a model that answers): the agent, asked each question in a new
  conversation, says the right answer and not the superseded one;
- the learning model's calls and prompt tokens per interaction, and the rows stored.

``--llm`` takes any model spec ``llm=`` takes; the agent answers with it and memory learns
with it. ``--llm scripted`` (the default) is a *perfect extractor*: a scripted model that
returns exactly the facts each message states (written next to the message below) and
consolidates by keeping the profile as it is. Its figures measure the mechanism (entries,
supersession, what reaches the prompt), not a model's understanding: a fact that only a
model's consolidation can retire (a contradicted goal) stays wrong with it.

    python -m bench.bench_memory_recall                          # the mechanism, scripted
    python -m bench.bench_memory_recall --llm local              # the offline model
    python -m bench.bench_memory_recall --llm local --force-learn  # ...made to learn anyway
    OPENAI_API_KEY=… python -m bench.bench_memory_recall --llm openai:gpt-4o-mini
    python -m bench.bench_memory_recall --llm anthropic:claude-haiku-4-5 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cogency import Agent
from cogency.llm.base import LLM, Completion
from cogency.memory import Memory
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM
from cogency.tokens import count_tokens


@dataclass
class Say:
    """One user message, and the facts it states (what a perfect extractor learns from it:
    ``preferences`` key/value pairs, ``goals`` texts)."""

    text: str
    preferences: dict[str, str] = field(default_factory=dict)
    goals: list[str] = field(default_factory=list)
    style: str = ""


@dataclass
class Question:
    ask: str
    right: tuple[str, ...]
    """Any of these words (lower case) in an answer or the prompt counts as right."""
    wrong: tuple[str, ...] = ()
    """What was true once and is not now (an answer holding one is wrong)."""


@dataclass
class Scenario:
    user: str
    sessions: list[list[Say]]
    questions: list[Question]


SCENARIOS = [
    Scenario("ada", [
        [Say("Hi, I'm Ada. I live in Paris and I write Python for a living.",
             {"city": "Paris", "language": "Python"}),
         Say("What is a good way to structure a small web service?")],
        [Say("Some news: I moved to Berlin last month.", {"city": "Berlin"}),
         Say("And at work we switched from Python to Rust, so Rust is my language now.",
             {"language": "Rust"})],
        [Say("My cat is called Miso, by the way.", {"cat": "Miso"}),
         Say("Please keep answers short and to the point.", style="short and to the point")],
    ], [
        Question("Which city do I live in?", ("berlin",), ("paris",)),
        Question("Which programming language do I use at work now?", ("rust",), ("python",)),
        Question("What is my cat's name?", ("miso",)),
    ]),
    Scenario("ben", [
        [Say("My favourite editor is vim, I use it every day.", {"editor": "vim"}),
         Say("My goal this year is to run a marathon.", goals=["run a marathon"])],
        [Say("The project deadline is Friday.", {"deadline": "Friday"}),
         Say("I gave up on vim; helix is my editor now.", {"editor": "helix"})],
        [Say("Correction: the deadline moved to Monday.", {"deadline": "Monday"}),
         Say("I dropped the marathon; I'm training for a triathlon instead.",
             goals=["train for a triathlon"])],
    ], [
        Question("Which editor do I use?", ("helix",), ("vim",)),
        Question("When is my project deadline?", ("monday",), ("friday",)),
        Question("What am I training for this year?", ("triathlon",), ("marathon",)),
    ]),
    Scenario("chen", [
        [Say("I'm vegetarian, so no meat in recipes please.", {"diet": "vegetarian"}),
         Say("Our team has 3 engineers.", {"team size": "3"})],
        [Say("Update: I'm fully vegan now.", {"diet": "vegan"}),
         Say("We hired two people, so the team is 5 engineers.", {"team size": "5"})],
        [Say("I deploy everything on Kubernetes.", {"platform": "Kubernetes"})],
    ], [
        Question("What is my diet?", ("vegan",), ("vegetarian",)),
        Question("How many engineers are on my team?", ("5", "five"), ("3", "three")),
        Question("Where do I deploy my services?", ("kubernetes",)),
    ]),
]


def _facts(text: str) -> Say | None:
    for scenario in SCENARIOS:
        for session in scenario.sessions:
            for say in session:
                if say.text == text:
                    return say
    return None


_QUERY = re.compile(r"^Query: (.*)$", re.M)


def perfect_extractor() -> ScriptedLLM:
    """The scripted learner and agent: learning returns exactly the facts each message states
    (as ``Say`` records them); consolidation keeps the profile it is shown; an agent step
    answers with nothing of the profile (scripted answers are not measured)."""

    def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        prompt = messages[-1]["content"]
        if "<interaction>\nQuery:" in prompt:
            preferences: dict[str, str] = {}
            goals: list[str] = []
            style = ""
            for query in _QUERY.findall(prompt):
                say = _facts(query)
                if say is not None:
                    preferences.update(say.preferences)
                    goals.extend(say.goals)
                    style = say.style or style
            return {"preferences": [{"key": k, "value": v} for k, v in preferences.items()],
                    "goals": goals, "expertise": [], "communication_style": style,
                    "project_context": [], "interests": [], "constraints": [],
                    "success_pattern": "", "failure_pattern": ""}
        if "consolidate" in prompt and "<profile>" in prompt:
            return json.loads(prompt.split("<profile>\n", 1)[1].split("\n</profile>", 1)[0])
        return {"secure": True, "response": "noted", "actions": []}

    return ScriptedLLM(_endless(reply))


def _endless(item: Any) -> Any:
    while True:
        yield item


class Recording(LLM):
    """A model seen through a counter of its calls and prompt tokens (the learning model)."""

    def __init__(self, inner: LLM) -> None:
        self.inner = inner
        self.name = inner.name
        self.learns = getattr(inner, "learns", True)
        self.context_window = inner.context_window
        self.calls = 0
        self.prompt_tokens = 0

    async def generate(self, messages: Any, *, schema: Any = None) -> Completion:
        self.calls += 1
        self.prompt_tokens += sum(count_tokens(m["content"]) for m in messages)
        return await self.inner.generate(messages, schema=schema)

    async def start(self) -> None:
        await self.inner.start()


@dataclass
class Tally:
    questions: int = 0
    recalled: int = 0
    wrong_held: int = 0
    answered: int = 0
    answered_right: int = 0
    lines: list[str] = field(default_factory=list)


async def bench(spec: str, force_learn: bool, answer: bool) -> dict[str, Any]:
    from cogency.llm.resolve import resolve_llm

    if spec == "scripted":
        model: LLM = perfect_extractor()
        owned = False
    else:
        model, owned = resolve_llm(spec)
    if force_learn:
        model.learns = True  # type: ignore[attr-defined]
    learner = Recording(model)
    interactions = 0
    total = Tally()
    contexts: dict[str, str] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "recall.db")
        agent = Agent(llm=model, store=store, memory=Memory(llm=learner, settle_timeout=300))
        try:
            for scenario in SCENARIOS:
                for session in scenario.sessions:
                    conversation = None
                    for say in session:
                        result = await agent.run(say.text, scenario.user, conversation)
                        conversation = result.conversation_id
                        interactions += 1
                        await agent.memory.settle()  # a person types slower than this learns
                context = (await agent.memory.activate(scenario.user)).lower()
                contexts[scenario.user] = context
                for question in scenario.questions:
                    total.questions += 1
                    right = _holds(context, question.right)
                    wrong = _holds(context, question.wrong)
                    total.recalled += right
                    total.wrong_held += wrong
                    said = ""
                    if answer and spec != "scripted":
                        reply = await agent.run(question.ask, scenario.user)
                        said = (reply.response or "").lower()
                        total.answered += 1
                        total.answered_right += (_holds(said, question.right)
                                                 and not _holds(said, question.wrong))
                    total.lines.append(
                        f"{scenario.user:5} {question.ask:55} profile: "
                        f"{'right' if right else 'missing':7} "
                        f"{'+ WRONG' if wrong else '':7}"
                        + (f" answer: {said[:60]!r}" if said else ""))
            rows = {table: (await _rows(store, table)) for table in
                    ("profile_entries", "learning_queue")}
            await agent.close()
            await store.close()
        finally:
            if owned:
                await model.close()
    return {
        "llm": spec, "learns": bool(getattr(model, "learns", True)),
        "scenarios": len(SCENARIOS), "interactions": interactions,
        "questions": total.questions, "profile_recall": total.recalled,
        "wrong_facts_in_prompt": total.wrong_held,
        "answers_right": total.answered_right if total.answered else None,
        "learning_calls_per_interaction": learner.calls / interactions,
        "learning_prompt_tokens_per_interaction": learner.prompt_tokens / interactions,
        "rows": rows, "seconds": round(time.monotonic() - began, 1), "lines": total.lines,
        "contexts": contexts,
    }


def _holds(text: str, words: tuple[str, ...]) -> bool:
    """Whether ``text`` holds one of ``words`` as a word (``5`` is not in ``15``)."""
    return any(re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) for word in words)


async def _rows(store: SQLiteStore, table: str) -> int:
    def count(db: Any) -> int:
        return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    return await store._run(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default="scripted",
                        help="scripted (a perfect extractor: the mechanism), local, or any "
                             "model spec (openai:gpt-4o-mini, anthropic:…, ollama:…)")
    parser.add_argument("--force-learn", action="store_true",
                        help="learn even with a model that says it cannot (the default local "
                             "one), to see what it would learn")
    parser.add_argument("--no-answers", action="store_true",
                        help="check the profile only; do not ask the agent the questions")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--show-profiles", action="store_true",
                        help="also print each user's USER CONTEXT as the prompt quotes it")
    args = parser.parse_args()
    figures = asyncio.run(bench(args.llm, args.force_learn, not args.no_answers))
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for line in figures["lines"]:
        print(line)
    if args.show_profiles:
        for user, context in figures["contexts"].items():
            print(f"\n--- {user}\n{context or '(nothing learned)'}")
    questions = figures["questions"]
    print(f"\nmodel                         {figures['llm']}"
          + ("" if figures["learns"] else "  (says it cannot learn: nothing is learned)"))
    print(f"interactions learned from     {figures['interactions']} in "
          f"{figures['scenarios']} scenarios")
    print(f"profile recall                {figures['profile_recall']}/{questions}")
    print(f"wrong facts in the prompt     {figures['wrong_facts_in_prompt']}/{questions}")
    if figures["answers_right"] is not None:
        print(f"answers right                 {figures['answers_right']}/{questions}")
    print(f"learning calls / interaction  {figures['learning_calls_per_interaction']:.2f}")
    print(f"learning prompt tokens / int. {figures['learning_prompt_tokens_per_interaction']:.0f}")
    print(f"rows stored                   {figures['rows']}")
    print(f"time                          {figures['seconds']} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
