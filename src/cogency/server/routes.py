"""The native API: runs (live over SSE, or waited for), tasks, conversations, the profile.

Every route here sits behind :func:`.auth.caller`; what it reads and writes is the key's
user's, through the :class:`~.auth.Caller` it is given.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from . import sse
from .auth import Caller, caller
from .runs import Run

router = APIRouter(prefix="/api", dependencies=[Depends(caller)])

_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The result (JSON), or with `stream: true` the run's events as "
                       "Server-Sent Events: `start`, `reason`, `action`, `result`, `response`, "
                       "`error`, `end` (+ `token`), each `data:` one event's JSON.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}


class RunRequest(BaseModel):
    query: str = Field(min_length=1, description="What to ask the agent.")
    conversation_id: str | None = Field(
        None, description="Continue this conversation: one of yours (404 otherwise); a new "
                          "one, with an id the server makes, when absent."
    )
    stream: bool = Field(False, description="Answer with the run's events as SSE.")


class ResumeRequest(BaseModel):
    stream: bool = False


class Decisions(BaseModel):
    decisions: dict[str, bool] = Field(
        min_length=1, description="Each waiting call's id: true to allow it, false to deny it."
    )
    stream: bool = Field(False, description="Answer with the resumed run's events as SSE.")


class ApprovalOut(BaseModel):
    id: str
    name: str
    args: dict[str, Any]
    decider: str = Field("person", description="person: approve or deny it; client: a call of "
                                               "a client's tool (OpenAI endpoints), answered "
                                               "with its result")


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    calls: int


class RunResult(BaseModel):
    task_id: str
    conversation_id: str
    response: str | None
    stop_reason: str = Field(description="completed, security, max_iterations, no_progress, "
                                         "repeated_calls, invalid_response, error, cancelled, "
                                         "awaiting_approval")
    iterations: int
    usage: Usage
    error: str | None
    pending_approvals: list[ApprovalOut] = Field(
        default_factory=list,
        description="With stop_reason awaiting_approval: the calls waiting for a decision.")
    truncated: bool = Field(False, description="The answer was cut at the client's max_tokens.")


class TaskOut(BaseModel):
    task_id: str
    conversation_id: str
    query: str
    workspace: dict[str, Any]
    updated_at: datetime | None
    pending_approvals: list[ApprovalOut] = Field(
        default_factory=list, description="Tool calls this task waits on you to decide.")


class ConversationOut(BaseModel):
    conversation_id: str
    messages: int
    updated_at: datetime | None


class MessageOut(BaseModel):
    seq: int
    role: str
    content: str
    task_id: str | None
    created_at: str | None


class LearningOut(BaseModel):
    pending: int = Field(description="Finished tasks waiting to be learned from.")
    dropped: int = Field(description="Older tasks left out: more waited than are kept.")
    attempts: int = Field(description="Attempts that failed since learning last succeeded.")
    last_error: str | None
    next_attempt_at: str | None
    claimed: bool = Field(description="Being learned now.")
    since: str | None


class ProfileOut(BaseModel):
    user_id: str
    profile: dict[str, Any] | None = Field(description="What is known of you; null if nothing.")
    learning: LearningOut | None = Field(
        None, description="What waits to be learned about you (or failed); null if nothing.")


class Quote(BaseModel):
    id: str | None
    role: str | None
    content: str
    created_at: str | None


class Source(BaseModel):
    task_id: str | None
    conversation_id: str | None
    message_ids: list[str]
    at: str | None
    model: str | None
    quotes: list[Quote] | None = Field(
        None, description="The cited messages (the newest sources only); [] if no longer stored.")


class EntryOut(BaseModel):
    entry_id: str
    field: str
    key: str = Field(description="A preference's or project's name; empty elsewhere.")
    value: str
    origin: str = Field(description="learned, consolidated, or user (yours: learning never "
                                    "replaces it)")
    model: str | None
    sources: list[Source]
    sources_omitted: int
    created_at: str
    updated_at: str
    superseded_at: str | None = Field(description="Set on history: no longer in the profile.")
    superseded_by: str | None
    reason: str | None


class EntryIn(BaseModel):
    field: str = Field(description="preferences, goals, expertise_areas, communication_style, "
                                   "projects, interests, constraints, success_patterns or "
                                   "failure_patterns")
    value: str = Field(min_length=1, max_length=500)
    key: str | None = Field(None, max_length=500,
                            description="The name of a preference or project (required there).")
    replaces: str | None = Field(None, max_length=64,
                                 description="The id of a current entry this one replaces.")


class Counts(BaseModel):
    profiles: int
    entries: int
    history: int
    conversations: int
    messages: int
    tasks: int
    approvals: int
    pending_learning: int


class Forgotten(BaseModel):
    user_id: str
    forgotten: bool = True
    generation: int = Field(description="Your generation now: learning that began before "
                                        "this forget never stores anything.")
    erased: Counts = Field(description="What was erased, per kind (the rows that were there).")
    tool_directory: str | None = Field(
        None, description="The directory your tools had on the server, deleted (null: none).")
    tool_files: int = Field(0, description="Files and directories it held.")


async def _answer(run: Run, stream: bool) -> RunResult | StreamingResponse:
    if stream:
        return sse.response(run)
    return RunResult.model_validate(await run.finished())


@router.post("/runs", response_model=RunResult, responses=_STREAM, summary="Start a run")
async def start_run(
    body: RunRequest, me: Caller = Depends(caller)
) -> RunResult | StreamingResponse:
    """Run the agent on `query`; wait for its result, or follow it live with `stream: true`.

    One run at a time per conversation: while one is in flight, another gets 409. With an
    `Idempotency-Key` header, the same key (within 24 h) gets the run the first request
    started, never a second run."""
    run = await me.run(body.query, body.conversation_id, once=me.once(body))
    return await _answer(run, body.stream)


@router.post("/tasks/{task_id}/resume", response_model=RunResult, responses=_STREAM,
             summary="Resume an unfinished task")
async def resume_task(
    task_id: str, body: ResumeRequest | None = None, me: Caller = Depends(caller)
) -> RunResult | StreamingResponse:
    body = body or ResumeRequest()
    return await _answer(await me.resume(task_id, once=me.once(body)), body.stream)


@router.get("/tasks", response_model=list[TaskOut], summary="Your unfinished tasks")
async def list_tasks(me: Caller = Depends(caller)) -> list[TaskOut]:
    return [_task(task) for task in await me.tasks()]


@router.get("/tasks/{task_id}", response_model=TaskOut, summary="One unfinished task")
async def get_task(task_id: str, me: Caller = Depends(caller)) -> TaskOut:
    return _task(await me.task(task_id))


@router.get("/tasks/{task_id}/approvals", response_model=list[ApprovalOut],
            summary="The tool calls a task waits on you to approve or deny")
async def list_approvals(task_id: str, me: Caller = Depends(caller)) -> list[ApprovalOut]:
    return _task(await me.task(task_id)).pending_approvals


@router.post("/tasks/{task_id}/approvals", response_model=RunResult, responses=_STREAM,
             summary="Approve or deny the calls a task waits for, and resume it")
async def decide(
    task_id: str, body: Decisions, me: Caller = Depends(caller)
) -> RunResult | StreamingResponse:
    """Allowed calls run (once), denied ones give the model a "denied by the user" result,
    then the task goes on."""
    return await _answer(await me.resume(task_id, body.decisions, once=me.once(body)),
                         body.stream)


@router.get("/conversations", response_model=list[ConversationOut],
            summary="Your conversations, newest first")
async def list_conversations(me: Caller = Depends(caller)) -> list[ConversationOut]:
    return [
        ConversationOut(conversation_id=item.conversation_id, messages=item.message_count,
                        updated_at=item.updated_at)
        for item in await me.conversations()
    ]


@router.get("/conversations/{conversation_id}/messages", response_model=list[MessageOut],
            summary="A conversation's newest messages, oldest first")
async def list_messages(
    conversation_id: str,
    limit: int = Query(100, ge=1, le=1000),
    me: Caller = Depends(caller),
) -> list[MessageOut]:
    return [
        MessageOut(seq=m["seq"], role=m["role"], content=m["content"],
                   task_id=m.get("task_id"), created_at=m.get("created_at"))
        for m in await me.messages(conversation_id, limit)
    ]


@router.get("/profile", response_model=ProfileOut, summary="What is known of you")
async def show_profile(me: Caller = Depends(caller)) -> ProfileOut:
    profile = await me.profile()
    learning = await me.learning()
    return ProfileOut(
        user_id=me.user_id, profile=None if profile is None else profile.to_dict(),
        learning=None if learning is None else LearningOut.model_validate(learning.to_dict()),
    )


@router.get("/profile/why", response_model=list[EntryOut],
            summary="Each entry of your profile with where it was learned")
async def explain_profile(me: Caller = Depends(caller)) -> list[dict[str, Any]]:
    """Every current entry with its sources: the tasks and messages it was learned from, when
    and by which model; the newest sources quote the messages."""
    return await me.explain()


@router.get("/profile/history", response_model=list[EntryOut],
            summary="Entries replaced or dropped, most recent first")
async def profile_history(me: Caller = Depends(caller)) -> list[dict[str, Any]]:
    return [entry.to_dict() for entry in await me.history()]


@router.post("/profile/entries", response_model=EntryOut, status_code=201,
             summary="Add or change an entry of your profile")
async def set_entry(body: EntryIn, me: Caller = Depends(caller)) -> dict[str, Any]:
    """Your entry wins over learning: learning and consolidation never replace or drop it.
    A preference or project with the same key (or `replaces`) becomes history."""
    entry = await me.set_entry(body.field, body.value, body.key, body.replaces)
    return entry.to_dict()


@router.delete("/profile/entries/{entry_id}", response_model=EntryOut,
               summary="Remove an entry of your profile (it stays in the history)")
async def remove_entry(entry_id: str, me: Caller = Depends(caller)) -> dict[str, Any]:
    return (await me.remove_entry(entry_id)).to_dict()


@router.get("/profile/export", summary="Everything stored about you, as one JSON document")
async def export_profile(me: Caller = Depends(caller)) -> dict[str, Any]:
    """Profile, entries with their history, conversations with every message, unfinished
    tasks with their approvals, queued learning (`cogency profile export`'s document)."""
    return await me.export()


@router.post("/profile/import", response_model=Counts, status_code=201,
             summary="Restore an export of yourself")
async def import_profile(
    document: dict[str, Any] = Body(description="A document of GET /api/profile/export."),
    me: Caller = Depends(caller),
) -> dict[str, int]:
    """Restores it as you (whoever it names), only when nothing of yours is stored (409
    otherwise: forget first) and none of its ids exist; 400 for a malformed document."""
    return await me.import_(document)


@router.delete("/profile", response_model=Forgotten,
               summary="Forget you: profile, conversations, messages, tasks and tool files")
async def forget_profile(me: Caller = Depends(caller)) -> Forgotten:
    """Returns what was erased, per kind, the directory your tools had (deleted with all it
    held), and the generation that fences learning in flight."""
    receipt = await me.forget()
    return Forgotten.model_validate({"forgotten": True, **receipt.to_dict()})


def _task(task: Any) -> TaskOut:
    pending = [ApprovalOut(id=call["id"], name=call["name"], args=call.get("args") or {},
                           decider=call.get("decider", "person"))
               for call in task.pending_approvals if call.get("status", "pending") == "pending"]
    return TaskOut(task_id=task.task_id, conversation_id=task.conversation_id, query=task.query,
                   workspace=task.workspace, updated_at=task.updated_at,
                   pending_approvals=pending)
