"""Brokerless asyncio client: :class:`AsyncLocalClient`, the :class:`LocalClient` interface as coroutines.

It holds a :class:`LocalClient` and uses only its public surface. Calls that
never wait run the LocalClient method in ``asyncio.to_thread``. The three
that may wait (``send``, ``send_json``, ``send_batch``: for capacity;
``receive``: long polling) run the same operations LocalClient runs
(``LocalClient.sender`` / ``LocalClient.receiver``), driven here: file work
in worker threads, sleeps awaited on the event loop (woken from the inotify
thread), so a waiting call ties up no thread and never blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from mqcore.client._local import LocalClient
from mqcore.client._local_send import json_body
from mqcore.client._local_waiters import Op, Sleep, Undoable
from mqcore.client._renamed import renamed_keyword
from mqcore.client.api import AsyncQueueClient, documented_by
from mqcore.client.types import JSON_CONTENT_TYPE, BatchEntry, Message, PeekedMessage, PeekPage
from mqcore.errors import MQError
from mqcore.limits import DEFAULT_BATCH_MESSAGES, DEFAULT_PEEK_LIMIT
from mqcore.service.plans import run_async

__all__ = ["AsyncLocalClient"]

T = TypeVar("T")


async def _sleep(step: Sleep) -> None:
    """Await ``step``'s waiter on the loop (woken from the inotify thread), at most its timeout."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(event.set)

    if step.watches.listen(step.waiter, notify):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), step.timeout_seconds)


async def _call(step: Undoable[T]) -> T:
    """Run ``step``'s file work in a worker thread; if the caller is cancelled meanwhile, undo its result."""
    future = asyncio.ensure_future(asyncio.to_thread(step.fn))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        undo = step.undo

        def give_back(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                undo(done.result())

        future.add_done_callback(give_back)
        raise


async def _drive(op: Op[T], expand: Callable[[Any], Op[Any]] | None = None) -> T:
    """Run ``op`` on the event loop (:func:`mqcore.service.plans.run_async`), the twin of ``_local_waiters.drive``."""

    async def handle(step: Any) -> Any:
        if isinstance(step, Sleep):
            return await _sleep(step)
        if isinstance(step, Undoable):
            return await _call(step)
        if expand is None:
            raise TypeError(f"no handler for {step!r}")
        return await run_async(expand(step), asyncio.to_thread, handle)

    return await run_async(op, asyncio.to_thread, handle)


@documented_by(AsyncQueueClient)
class AsyncLocalClient:
    """:class:`LocalClient` with every method a coroutine, for asyncio programs.

    Its methods are the asyncio client interface, documented once in
    ``mqcore.client.api.AsyncQueueClient``.

    File work runs in ``asyncio.to_thread``; long polls and capacity waits
    are awaited on the event loop (woken by the inotify thread), so a waiting
    receive ties up no thread and never blocks the loop.

    Args:
        root: The queue root.
        fsync: As :class:`LocalClient`.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.sync = LocalClient(root, fsync=fsync)
        self.root = self.sync.root

    def __repr__(self) -> str:
        return f"AsyncLocalClient({self.root!r})"

    async def __aenter__(self) -> AsyncLocalClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def list_queues(self, prefix: str = "") -> list[str]:
        return await asyncio.to_thread(self.sync.list_queues, prefix)

    async def create_queue(self, queue: str, attributes: Mapping[str, Any] | None = None) -> bool:
        return await asyncio.to_thread(self.sync.create_queue, queue, attributes)

    async def delete_queue(self, queue: str) -> None:
        await asyncio.to_thread(self.sync.delete_queue, queue)

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.queue_stats, queue)

    async def get_attributes(self, queue: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.get_attributes, queue)

    async def set_attributes(self, queue: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.set_attributes, queue, changes)

    async def purge(self, queue: str) -> int:
        return await asyncio.to_thread(self.sync.purge, queue)

    async def send(
        self,
        queue: str,
        body: bytes | str,
        *,
        content_type: str | None = None,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
        group_id: str | None = None,
        deduplication_id: str | None = None,
    ) -> str:
        entry = BatchEntry(body, content_type, attributes, delay_seconds, group_id, deduplication_id)
        return await _drive(self.sync.sender.send_op(queue, entry))

    async def send_json(
        self,
        queue: str,
        value: Any,
        *,
        attributes: Mapping[str, str] | None = None,
        delay_seconds: int | None = None,
    ) -> str:
        return await self.send(
            queue, json_body(value), content_type=JSON_CONTENT_TYPE, attributes=attributes, delay_seconds=delay_seconds
        )

    async def send_batch(
        self, queue: str, entries: Iterable[bytes | str | BatchEntry], *, batch_size: int = DEFAULT_BATCH_MESSAGES
    ) -> list[str | MQError]:
        return await _drive(self.sync.sender.send_batch_op(queue, entries, batch_size))

    async def receive(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_time_seconds: int | None = None,
        visibility_timeout_seconds: int | None = None,
        attempt_id: str | None = None,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> list[Message]:
        receiver = self.sync.receiver
        op = receiver.receive_op(
            queue, max_messages, wait_time_seconds, visibility_timeout_seconds, attempt_id, partition, partitions
        )
        return await _drive(op, receiver.expand)

    async def delete(self, queue: str, receipt_handle: str) -> None:
        await asyncio.to_thread(self.sync.delete, queue, receipt_handle)

    async def delete_by_id(self, queue: str, message_id: str) -> None:
        await asyncio.to_thread(self.sync.delete_by_id, queue, message_id)

    async def delete_batch(self, queue: str, receipt_handles: Sequence[str]) -> list[MQError | None]:
        return await asyncio.to_thread(self.sync.delete_batch, queue, receipt_handles)

    @renamed_keyword("timeout_seconds", "visibility_timeout_seconds", removed_in="0.2")
    async def change_visibility(self, queue: str, receipt_handle: str, visibility_timeout_seconds: int) -> int:
        return await asyncio.to_thread(self.sync.change_visibility, queue, receipt_handle, visibility_timeout_seconds)

    async def change_visibility_batch(self, queue: str, entries: Sequence[tuple[str, int]]) -> list[int | MQError]:
        return await asyncio.to_thread(self.sync.change_visibility_batch, queue, entries)

    async def ack(self, message: Message) -> None:
        await asyncio.to_thread(self.sync.ack, message)

    async def nack(self, message: Message, delay_seconds: int = 0) -> None:
        await asyncio.to_thread(self.sync.nack, message, delay_seconds)

    async def peek(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PEEK_LIMIT,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> PeekPage:
        return await asyncio.to_thread(
            lambda: self.sync.peek(queue, after=after, limit=limit, partition=partition, partitions=partitions)
        )

    async def peek_ids(self, queue: str, message_ids: Sequence[str]) -> list[PeekedMessage]:
        return await asyncio.to_thread(self.sync.peek_ids, queue, message_ids)

    async def delete_by_ids(self, queue: str, message_ids: Sequence[str]) -> list[MQError | None]:
        return await asyncio.to_thread(self.sync.delete_by_ids, queue, message_ids)

    def iter_peek(
        self,
        queue: str,
        *,
        page_size: int = DEFAULT_PEEK_LIMIT,
        partition: int | None = None,
        partitions: int | None = None,
    ) -> AsyncIterator[PeekedMessage]:

        async def pages() -> AsyncIterator[PeekedMessage]:
            after: str | None = None
            while True:
                page = await self.peek(queue, after=after, limit=page_size, partition=partition, partitions=partitions)
                for message in page.messages:
                    yield message
                if page.next_after is None:
                    return
                after = page.next_after

        return pages()

    async def start_redrive(
        self, queue: str, *, destination: str | None = None, max_messages_per_second: int | None = None
    ) -> dict[str, Any]:
        return await asyncio.to_thread(
            lambda: self.sync.start_redrive(
                queue, destination=destination, max_messages_per_second=max_messages_per_second
            )
        )

    async def redrive_status(self, queue: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.sync.redrive_status, queue)

    async def cancel_redrive(self, queue: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.cancel_redrive, queue)
