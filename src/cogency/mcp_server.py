"""``cogency mcp``: a Cogency agent served over MCP (stdio), so an MCP host (an IDE, a desktop
assistant, another agent) can use an agent that remembers its user.

The server offers two tools. ``ask`` runs a query as one task of the agent, in a new
conversation or in ``conversation_id``, and returns the answer and the conversation id (to
pass back for the next question). A task whose tool calls need approval stops with
``stop_reason="awaiting_approval"`` and lists them; ``decide`` approves or denies them and
continues the task (the MCP host's user is the person asked). Every task is the served
user's; the host cannot choose another user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import CogencyError

if TYPE_CHECKING:
    from .agent import Agent, AgentResult

ASK_DESCRIPTION = (
    "Ask a Cogency agent that remembers its user across conversations. Returns the answer and "
    "the conversation_id; pass conversation_id back to continue the same conversation."
)
DECIDE_DESCRIPTION = (
    "Continue a task of the agent that stopped with stop_reason 'awaiting_approval': approve "
    "or deny each of its pending_approvals by id (every pending call must be decided). Returns "
    "what ask returns."
)


def build_server(agent: Agent, user_id: str) -> Any:
    """An MCP server (the SDK's ``MCPServer``) whose ``ask`` tool runs ``agent`` for ``user_id``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    from .tools.mcp import cogency_version

    server: Any = MCPServer(
        name="cogency",
        version=cogency_version(),
        instructions=f"A stateful Cogency agent serving user {user_id!r}.",
    )

    @server.tool(
        name="ask",
        description=ASK_DESCRIPTION,
        annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True),
    )
    async def ask(query: str, conversation_id: str | None = None) -> dict[str, Any]:
        try:
            if conversation_id is not None:
                await _existing(agent, conversation_id, user_id)
            result = await agent.run(query, user_id, conversation_id)
        except CogencyError as exc:  # a bad conversation id, a model that failed: say what
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        return _answer(result)

    @server.tool(
        name="decide",
        description=DECIDE_DESCRIPTION,
        annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True),
    )
    async def decide(
        task_id: str, approve: list[str] | None = None, deny: list[str] | None = None
    ) -> dict[str, Any]:
        approvals = {call: True for call in approve or []}
        approvals.update({call: False for call in deny or []})
        try:
            result = await agent.resume(task_id, user_id, approvals=approvals)
        except CogencyError as exc:  # an unknown task or call, calls left undecided
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        return _answer(result)

    return server


async def _existing(agent: Agent, conversation_id: str, user_id: str) -> None:
    """Refuse a conversation id the user does not have (as ``cogency run --conversation``
    does): a mistyped id would otherwise start a new conversation under that id, silently."""
    from .errors import NotFoundError
    from .state.state import check_id

    check_id(conversation_id, "conversation_id")
    try:
        await agent.store.load_conversation(conversation_id, user_id)
    except NotFoundError:
        raise NotFoundError(
            f"no conversation {conversation_id!r} for this user; pass a conversation_id that "
            "ask returned, or leave it out to start a new conversation"
        ) from None


def _answer(result: AgentResult) -> dict[str, Any]:
    return {
        "answer": result.response,
        "conversation_id": result.conversation_id,
        "task_id": result.task_id,
        "stop_reason": result.stop_reason,
        "error": result.error,
        "pending_approvals": result.pending_approvals,
    }


async def serve_stdio(agent: Agent, user_id: str) -> None:
    """Serve ``agent`` over MCP on this process's stdin and stdout until the host disconnects."""
    await build_server(agent, user_id).run_stdio_async()
