"""Situated memory: the profile each user builds up, how it is learned, how it enters the prompt."""

from .memory import PROFILE_TOKENS, Memory, interaction_of
from .profile import Profile
from .synthesizer import ImpressionSynthesizer

__all__ = ["PROFILE_TOKENS", "ImpressionSynthesizer", "Memory", "Profile", "interaction_of"]
