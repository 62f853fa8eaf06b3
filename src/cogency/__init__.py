"""Cogency: stateful LLM agents.

An agent that remembers its user, carries a conversation across tasks, keeps a working
memory per task that survives a crash, and runs a pure ReAct loop with a JSON contract.
"""

from .agent import Agent, AgentResult
from .errors import CogencyError
from .memory import Memory, Profile
from .tools import Tool, tool

__version__ = "0.1.0"

__all__ = ["Agent", "AgentResult", "CogencyError", "Memory", "Profile", "Tool", "tool"]
