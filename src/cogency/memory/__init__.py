"""Situated memory: the profile each user builds up, how it is learned, how it enters the prompt."""

from .entries import ProfileEntry
from .memory import PROFILE_TOKENS, Memory, interaction_of
from .profile import Profile
from .synthesizer import ImpressionSynthesizer

__all__ = [
    "PROFILE_TOKENS", "ImpressionSynthesizer", "Memory", "Profile", "ProfileEntry",
    "interaction_of",
]
