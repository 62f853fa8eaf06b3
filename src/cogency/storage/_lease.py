"""Leases both stores hold the same way: a task's runner and a conversation's run are rows with
an epoch and an expiry (``lease_until``), renewed by the holder's store while the run goes on.

A lease is free once its holder is gone: no holder, an expiry passed, or a holder of this host
whose process ended. Every take (and every force release) bumps the row's epoch; a run's writes
carry the epochs it took and are refused once a row has moved on, so a run that lost its task
or its conversation writes nothing more (:class:`~cogency.errors.LeaseLostError`).

This module holds what the two stores say alike: when a lease is free (:func:`lease_free`,
from :mod:`.base`, which a learning claim uses too), what a hold's loss is called, and the
heartbeat that renews what a store holds (each store supplies the statement).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..errors import LeaseLostError, StorageError, UsageError
from .base import runner_alive

LEASE_SECONDS = 30.0
"""How long a hold lasts unless renewed; the store renews what it holds every third of it."""


def process_of(runner: str) -> str:
    """The process part of a runner (host, pid, start): the runs of one process share it."""
    return runner.rsplit("|", 1)[0]


def hold_lost(conversation_id: str) -> LeaseLostError:
    return LeaseLostError(
        f"this run no longer holds conversation {conversation_id!r}: its hold lapsed and "
        "another run took the conversation (or its task was released by force), so it stopped "
        "and wrote nothing more; see `cogency tasks`"
    )


Held = dict[str, tuple[str, int]]
"""id -> (runner, epoch) of what a store holds: tasks by task id, conversations by theirs."""

Renew = Callable[[Held, Held], Awaitable[tuple[set[str], set[str]]]]
"""A store's renewal: extends the leases still held as given; returns the task ids and the
conversation ids whose row has moved on (lost)."""


@dataclass
class Leases:
    """What one store holds, renewed in the background while anything is held.

    ``fences`` ties a task to the conversation hold it was begun or claimed under (task id ->
    (conversation id, hold epoch)): that task's writes are refused once the hold's row moves
    on, even if the same store holds the conversation again meanwhile for another run.
    """

    seconds: float
    renew: Renew
    tasks: Held = field(default_factory=dict)
    holds: Held = field(default_factory=dict)
    fences: dict[str, tuple[str, int]] = field(default_factory=dict)
    _beat: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def hold_task(self, task_id: str, runner: str, epoch: int, conversation_id: str) -> None:
        self.tasks[task_id] = (runner, epoch)
        hold = self.holds.get(conversation_id)
        if hold is not None:
            self.fences[task_id] = (conversation_id, hold[1])
        self._start()

    def drop_task(self, task_id: str) -> None:
        self.tasks.pop(task_id, None)
        self.fences.pop(task_id, None)

    def hold_conversation(self, conversation_id: str, runner: str, epoch: int) -> None:
        self.holds[conversation_id] = (runner, epoch)
        self._start()

    def drop_conversation(self, conversation_id: str, runner: str) -> None:
        if self.holds.get(conversation_id, (None,))[0] == runner:
            del self.holds[conversation_id]

    def fence(self, task_id: str) -> tuple[str, int] | None:
        """(conversation id, hold epoch) a write of this task must still find, if any."""
        return self.fences.get(task_id)

    def clear(self) -> None:
        self.tasks.clear()
        self.holds.clear()
        self.fences.clear()
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

    def _start(self) -> None:
        # One heartbeat for whatever is held. Letting go of the last hold does not stop it:
        # it ends by itself at its next beat if nothing is held then, so a run after run
        # (every turn holds its task) starts no task and cancels none.
        loop = asyncio.get_running_loop()
        if self._beat is None or self._beat.done() or self._beat.get_loop() is not loop:
            self._beat = loop.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.seconds / 3)
            if not self.tasks and not self.holds:
                return
            # A run that ended unreleased (its process knows it is over) renews no more.
            tasks, holds = dict(self.tasks), dict(self.holds)
            ended_tasks = {key for key, (runner, _) in tasks.items() if not runner_alive(runner)}
            ended_holds = {key for key, (runner, _) in holds.items() if not runner_alive(runner)}
            live_tasks = {k: v for k, v in tasks.items() if k not in ended_tasks}
            live_holds = {k: v for k, v in holds.items() if k not in ended_holds}
            try:
                lost_tasks, lost_holds = (await self.renew(live_tasks, live_holds)
                                          if live_tasks or live_holds else (set(), set()))
            except (StorageError, UsageError):
                # Nobody waits on a renewal: a busy or closed database lets the lease lapse,
                # and the run's next write (fenced by its epochs) reports what happened.
                lost_tasks, lost_holds = set(), set()
            # Only what is still as it was: a task or hold taken again meanwhile stays. A lost
            # task keeps its fence, so its next write is refused.
            for key in ended_tasks | lost_tasks:
                if self.tasks.get(key) == tasks[key]:
                    del self.tasks[key]
            for key in ended_holds | lost_holds:
                if self.holds.get(key) == holds[key]:
                    del self.holds[key]
