"""Resume a task in a process of its own: ``python client_tool_worker.py STORE TASK USER
RESULTS ANSWER`` resumes TASK of USER on the store at URL STORE with ``results`` (a JSON
object) and a model that answers ANSWER, then prints what it saw as one JSON line.

The agent here is made with no client tools, no instructions and no options: whatever the
resumed task uses of them comes from the database.
"""

from __future__ import annotations

import asyncio
import json
import sys

from cogency import Agent
from cogency.storage import open_store
from cogency.testing import ScriptedLLM


async def main() -> None:
    url, task_id, user_id, results, answer = sys.argv[1:]
    store = open_store(url)
    llm = ScriptedLLM([{"actions": [], "response": answer}])
    async with Agent(llm=llm, store=store) as agent:
        result = await agent.resume(task_id, user_id, results=json.loads(results))
    await store.close()
    print(json.dumps({
        "stop_reason": result.stop_reason, "response": result.response,
        "system": llm.calls[0][0]["content"], "messages": llm.calls[0][1:],
        "options": llm.call_options,
    }), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
