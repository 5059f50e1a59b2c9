"""A worker thread for the event loop: one hand-off per job, one wake of the loop per batch of jobs.

``loop.run_in_executor`` over a :class:`~concurrent.futures.ThreadPoolExecutor`
costs, per call, a concurrent future chained to an asyncio future, a work
item, a locked queue put and a wake of the loop for each result. Under load a
receive and a delete each paid that, and a pool of several threads woke
several threads that then fought for the GIL (most of mq's ~80 futex calls
per receive+delete at 16 clients, docs/performance.md "Receive and delete path").

A :class:`Handoff` is one thread with a job list. :meth:`Handoff.run` appends
a job and wakes the thread only if it sleeps; the thread takes every job
queued so far as one batch, runs them in order (FIFO: a queue's receives keep
their order), runs the optional ``after_batch`` step once for the batch (the
deletes' group commit: one fsync of ``remove/`` covers every rename of the
batch) and hands all results back with one ``call_soon_threadsafe``. Jobs that
arrive while a batch runs form the next batch, so the busier the daemon, the
fewer wake-ups per request.

It is also a :class:`concurrent.futures.Executor` (``submit``, ``shutdown``),
so ``loop.run_in_executor`` keeps working for the rarer callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

#: A job: the function, its arguments, and the future (asyncio or concurrent) that gets its outcome.
_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any] | Future[Any]"]
#: One outcome handed back to the loop: (future, succeeded, result or exception).
_Outcome = tuple["asyncio.Future[Any]", bool, Any]


class Handoff(Executor):
    """One thread that runs blocking jobs for the event loop, in submission order, in batches.

    Args:
        name: The thread's name (``ps -L``, py-spy).
        after_batch: Called on the thread after each batch in which at least one job
            succeeded (e.g. the fsync of ``remove/``). If it raises, every job of the batch
            that had succeeded gets that exception instead of its result (a copy each).
    """

    def __init__(self, name: str, after_batch: Callable[[], None] | None = None) -> None:
        self.name = name
        self._after_batch = after_batch
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: deque[_Job] = deque()
        self._idle = False
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the thread; await the returned future for its result (event loop thread only).

        Raises:
            RuntimeError: The handoff was shut down.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._put((fn, args, future))
        return future

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """:meth:`concurrent.futures.Executor.submit`: ``fn(*args, **kwargs)`` on the thread (any thread may call).

        Raises:
            RuntimeError: The handoff was shut down.
        """
        future: Future[T] = Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        self._put((call, () if kwargs else args, future))
        return future

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run a job after shutdown")
            self._jobs.append(job)
            if self._idle:
                self._wake.notify()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking jobs; the thread finishes the queued ones and ends (joined if ``wait``)."""
        with self._lock:
            self._closed = True
            self._wake.notify()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    if self._closed:
                        return
                    self._idle = True
                    self._wake.wait()
                    self._idle = False
                batch = list(self._jobs)
                self._jobs.clear()
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        outcomes: list[_Outcome] = []
        done: list[tuple[Future[Any], bool, Any]] = []
        succeeded = False
        for fn, args, future in batch:
            if isinstance(future, Future) and not future.set_running_or_notify_cancel():
                continue
            try:
                result: Any = fn(*args)
                ok = True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request, as run_in_executor does
                result, ok = exc, False
            succeeded = succeeded or ok
            if isinstance(future, Future):
                done.append((future, ok, result))
            else:
                outcomes.append((future, ok, result))
        if succeeded and self._after_batch is not None:
            try:
                self._after_batch()
            except BaseException as exc:  # noqa: BLE001 - given to every delete the batch covered
                outcomes = [(f, False, copy.copy(exc)) if ok else (f, ok, r) for f, ok, r in outcomes]
                done = [(f, False, copy.copy(exc)) if ok else (f, ok, r) for f, ok, r in done]
        for cfuture, ok, value in done:
            if ok:
                cfuture.set_result(value)
            else:
                cfuture.set_exception(value)
        if outcomes:
            loop = outcomes[0][0].get_loop()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits these any more
                loop.call_soon_threadsafe(_deliver, outcomes)


def _deliver(outcomes: list[_Outcome]) -> None:
    """On the loop: give each awaiting request its job's outcome."""
    for future, ok, value in outcomes:
        if future.cancelled():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
