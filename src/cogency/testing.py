"""Test doubles shipped with Cogency: a scripted model that goes through the real code path."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sized
from typing import Any, Union

from .errors import ScriptExhaustedError, UsageError
from .llm.base import LLM, Completion, Message, Usage
from .tokens import count_tokens

Reply = Union[str, dict[str, Any], Exception]
ScriptItem = Union[
    Reply, Callable[[list[Message]], Union[Reply, Awaitable[Reply]]]
]


class ScriptedLLM(LLM):
    """Replies from a script, one item per call, in order.

    Each item is a ``str`` (sent back verbatim, so malformed output can be tested), a ``dict``
    (sent back as its JSON), an exception instance (raised), or a callable of the messages
    returning one of those (it may be async, e.g. to wait on an event). ``calls`` holds the
    message lists it was sent: the lists themselves, never copies. ``delay`` seconds are
    awaited per call; ``chunk`` > 0 streams the reply in pieces of that many characters.

    ``responses`` may be a list or any iterable, read lazily: a generator gives an endless
    script (benchmarks, soak tests) without holding every reply in memory.
    """

    name = "scripted"

    def __init__(
        self,
        responses: Iterable[ScriptItem],
        *,
        delay: float = 0.0,
        chunk: int = 0,
        context_window: int = 128_000,
        count_usage: bool = False,
    ) -> None:
        self._queue: deque[ScriptItem] = deque()
        self._source: Iterator[ScriptItem] | None = None
        self.extend(responses)
        self.delay = delay
        self.chunk = chunk
        self.context_window = context_window
        self.count_usage = count_usage
        self.calls: list[list[Message]] = []

    @property
    def remaining(self) -> int | None:
        """Replies not yet used; ``None`` while an iterator script may still yield more."""
        return len(self._queue) if self._source is None else None

    def extend(self, responses: Iterable[ScriptItem]) -> None:
        """Add replies to the end of the script."""
        if self._source is None and isinstance(responses, Sized):
            self._queue.extend(responses)
            return
        later = iter(responses)
        self._source = later if self._source is None else itertools.chain(self._source, later)

    def _take(self) -> ScriptItem:
        if self._queue:
            return self._queue.popleft()
        if self._source is not None:
            for item in self._source:
                return item
            self._source = None
        raise ScriptExhaustedError(
            f"ScriptedLLM was called {len(self.calls)} times but has only "
            f"{len(self.calls) - 1} replies; add more replies to the script"
        )

    async def generate(
        self, messages: list[Message], *, schema: dict[str, Any] | None = None
    ) -> Completion:
        if not isinstance(messages, list):
            raise UsageError("messages must be a list of {'role', 'content'} dicts")
        self.calls.append(messages)
        item = self._take()
        if self.delay:
            await asyncio.sleep(self.delay)
        if callable(item):
            produced = item(messages)
            item = await produced if inspect.isawaitable(produced) else produced
        if isinstance(item, BaseException):
            raise item
        text = item if isinstance(item, str) else json.dumps(item)
        usage = Usage(calls=1)
        if self.count_usage:
            usage.input_tokens = sum(count_tokens(m["content"]) for m in messages)
            usage.output_tokens = count_tokens(text)
        return Completion(text, usage)

    async def stream(
        self, messages: list[Message], *, schema: dict[str, Any] | None = None
    ) -> AsyncIterator[str | Completion]:
        completion = await self.generate(messages, schema=schema)
        if self.chunk > 0:
            text = completion.text
            for start in range(0, len(text), self.chunk):
                yield text[start : start + self.chunk]
                await asyncio.sleep(0)
        yield completion


__all__ = ["ScriptedLLM"]
