"""Situated memory: the profile each user builds up, and how it enters the prompt."""

from .memory import PROFILE_TOKENS, Memory
from .profile import Profile

__all__ = ["PROFILE_TOKENS", "Memory", "Profile"]
