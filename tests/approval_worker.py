"""A process that pauses, decides or finishes a task, for tests that SIGKILL it.

    python approval_worker.py DB LOG pause            -> prints {"task_id", "call_id"}, then waits
    python approval_worker.py DB LOG approve TASK CALL -> the approved call appends to LOG, then
                                                          hangs (to be killed while it runs)
    python approval_worker.py DB LOG finish TASK      -> resumes without deciding; prints the result

The tool ``append`` needs approval; each run appends one line to LOG, so LOG counts the runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from cogency import Agent, tool
from cogency.storage import SQLiteStore
from cogency.testing import ScriptedLLM


def main() -> None:
    db, log, mode, *rest = sys.argv[1:]

    @tool(needs_approval=True)
    def append(text: str) -> str:
        """Append a line to the log."""
        with open(log, "a", encoding="utf-8") as out:
            out.write(text + "\n")
        if mode == "approve":
            time.sleep(120)  # killed while it runs
        return "appended"

    async def work() -> None:
        store = SQLiteStore(db)
        if mode == "pause":
            llm = ScriptedLLM([{"response": None,
                                "actions": [{"name": "append", "args": {"text": "once"}}]}])
        else:
            llm = ScriptedLLM([{"response": "Appended.", "actions": []}])
        agent = Agent(llm=llm, tools=[append], store=store)
        if mode == "pause":
            result = await agent.run("append once", user_id="ada")
            [call] = result.pending_approvals
            print(json.dumps({"task_id": result.task_id, "call_id": call["id"],
                              "stop_reason": result.stop_reason}), flush=True)
            await asyncio.sleep(600)  # a long-lived process: the test kills it here
        elif mode == "approve":
            task_id, call_id = rest
            await agent.resume(task_id, user_id="ada", approvals={call_id: True})
        else:
            result = await agent.resume(rest[0], user_id="ada")
            print(json.dumps({"stop_reason": result.stop_reason, "response": result.response}),
                  flush=True)
        await store.close()

    asyncio.run(work())


if __name__ == "__main__":
    main()
