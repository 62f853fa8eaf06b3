"""User code that type-checks under ``mypy --strict`` against Cogency's own hints (py.typed).

tests/test_typed_package.py runs mypy on this file; it is never imported by the tests.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from cogency import Agent, AgentResult, CogencyError, Tool, tool
from cogency.errors import AuthenticationError, LLMError
from cogency.events import Event
from cogency.llm import Usage
from cogency.storage import open_store
from cogency.testing import ScriptedLLM
from cogency.tools import files_tools


class Meeting(BaseModel):
    title: str
    at: datetime.datetime


@tool
def book(meeting: Meeting, minutes: Annotated[int, Field(ge=5)] = 30) -> str:
    """Book a meeting."""
    return f"{meeting.title} at {meeting.at:%H:%M} for {minutes} min"


@tool(timeout=5, needs_approval=True)
async def cancel(title: str) -> bool:
    """Cancel a meeting."""
    return bool(title)


async def main() -> str | None:
    tools: list[Tool] = [book, cancel, *files_tools(".")]
    store = open_store("sqlite:///agent.db")
    llm = ScriptedLLM([{"response": "booked"}])
    async with Agent(llm=llm, tools=tools, store=store, max_iterations=4) as agent:
        result: AgentResult = await agent.run("Book lunch", user_id="ada")
        usage: Usage = result.usage
        print(result.stop_reason, result.task_id, usage.input_tokens + usage.output_tokens)
        try:
            result.raise_for_error()
        except AuthenticationError:
            return None
        except LLMError as exc:
            print(exc.retried)
        except CogencyError:
            raise
        async for event in agent.stream("And dinner?", user_id="ada"):
            event_: Event = event
            print(event_.type, event_.to_dict())
    await store.close()
    return result.response


if __name__ == "__main__":
    print(asyncio.run(main()))
