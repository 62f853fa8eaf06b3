"""Test doubles shipped with Cogency: a scripted model that goes through the real code path."""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sized
from typing import Any, Union

from .errors import ScriptExhaustedError, UsageError
from .llm.base import LLM, Completion, Message, Usage, check_options
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

    :meth:`with_options` accepts every option (a copy that shares the script and ``calls``);
    ``call_options`` holds the options of each call, in the order of ``calls``.
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
        self._script = _Script()
        self.extend(responses)
        self.delay = delay
        self.chunk = chunk
        self.context_window = context_window
        self.count_usage = count_usage
        self.calls: list[list[Message]] = []
        self.options: dict[str, Any] = {}
        self.call_options: list[dict[str, Any]] = []

    @property
    def remaining(self) -> int | None:
        """Replies not yet used; ``None`` while an iterator script may still yield more."""
        script = self._script
        return len(script.queue) if script.source is None else None

    def extend(self, responses: Iterable[ScriptItem]) -> None:
        """Add replies to the end of the script."""
        script = self._script
        if script.source is None and isinstance(responses, Sized):
            script.queue.extend(responses)
            return
        later = iter(responses)
        script.source = later if script.source is None else itertools.chain(script.source, later)

    def with_options(self, **options: Any) -> ScriptedLLM:
        more = copy.copy(self)  # the same script, calls and call_options
        more.options = {**self.options, **check_options(options)}
        return more

    def _take(self) -> ScriptItem:
        script = self._script
        if script.queue:
            return script.queue.popleft()
        if script.source is not None:
            for item in script.source:
                return item
            script.source = None
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
        self.call_options.append(self.options)
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


class _Script:
    """The replies left: shared by a ScriptedLLM and its copies (``with_options``)."""

    def __init__(self) -> None:
        self.queue: deque[ScriptItem] = deque()
        self.source: Iterator[ScriptItem] | None = None


__all__ = ["ScriptedLLM"]
