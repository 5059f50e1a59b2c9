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
their order), and hands their results back to the loop together
(:mod:`daemons._loopdelivery`: one wake of the loop for everything finished
before the loop got to it). A job handed over with :meth:`Handoff.run_then`
names a step to run after it, once per batch for every job of the batch
that named it (the deletes' group commit: one fsync of ``remove/`` covers
every rename of the batch); those jobs are answered after their step, the
others of the batch before it. Jobs that arrive while a batch runs form the
next batch, so the busier the daemon, the fewer wake-ups per request. The
thread is started by the first job, so a fetcher that serves no queue costs
no thread.

It is also a :class:`concurrent.futures.Executor` (``submit``, ``shutdown``),
so ``loop.run_in_executor`` keeps working for the rarer callers.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from daemons._loopdelivery import Outcome, delivery_for

T = TypeVar("T")

#: A step run after a batch's jobs that named it (e.g. the fsync of ``remove/``).
Step = Callable[[], None]
#: A job: the function, its arguments, the future (asyncio or concurrent) that gets its outcome, its step.
_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any] | Future[Any]", Step | None]


class Handoff(Executor):
    """One thread that runs blocking jobs for the event loop, in submission order, in batches.

    Args:
        name: The thread's name (``ps -L``, py-spy).
        after_batch: The step of every job (as if each were handed over with
            :meth:`run_then`): run on the thread after each batch in which at
            least one job succeeded (e.g. the fsync of ``remove/``). If it raises,
            every job of the batch that had succeeded gets that exception instead
            of its result (a copy each).
    """

    def __init__(self, name: str, after_batch: Step | None = None) -> None:
        self.name = name
        self._after_batch = after_batch
        self._lock = threading.Lock()
        #: Held while the thread may sleep on it: released (under ``_lock``) once per wake. A bare lock,
        #: not a Condition, whose wait and notify are Python code (a lock made per wait): 5.3 against
        #: 5.6-6.2 us of CPU per job in bursts of 16 (docs/performance.md, stop 18).
        self._bell = threading.Lock()
        self._bell.acquire()
        self._jobs: deque[_Job] = deque()
        #: The thread sleeps (or is about to) on ``_bell``; whoever sets it False releases the bell once.
        self._idle = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the thread; await the returned future for its result (event loop thread only).

        Raises:
            RuntimeError: The handoff was shut down.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._put((fn, args, future, self._after_batch))
        return future

    def run_then(self, step: Step, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the thread, then ``step`` once for its batch; the future gets the outcome after both.

        Every job of a batch that named the same ``step`` (the same object)
        shares one call of it, made after all the batch's jobs ran and only if
        one of them succeeded; if it raises, each of them that had succeeded
        gets that exception (a copy each) instead of its result (event loop
        thread only).

        Raises:
            RuntimeError: The handoff was shut down.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._put((fn, args, future, step))
        return future

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """:meth:`concurrent.futures.Executor.submit`: ``fn(*args, **kwargs)`` on the thread (any thread may call).

        Raises:
            RuntimeError: The handoff was shut down.
        """
        future: Future[T] = Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        self._put((call, () if kwargs else args, future, self._after_batch))
        return future

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: cannot run a job after shutdown")
            self._jobs.append(job)
            if self._idle:
                self._idle = False
                self._bell.release()
            elif self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking jobs; the thread finishes the queued ones and ends (joined if ``wait``)."""
        with self._lock:
            self._closed = True
            if self._idle:
                self._idle = False
                self._bell.release()
            thread = self._thread
        if wait and thread is not None and threading.current_thread() is not thread:
            thread.join()

    def _serve(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    if self._closed:
                        return
                    self._idle = True  # the next job (or shutdown) releases the bell once
                    batch = None
                else:
                    batch = list(self._jobs)
                    self._jobs.clear()
            if batch is None:
                self._bell.acquire()
                continue
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        now: list[Outcome] = []  # answered before any step runs
        stepped: dict[Step, list[tuple[asyncio.Future[Any] | Future[Any], bool, Any]]] = {}
        for fn, args, future, step in batch:
            if isinstance(future, Future) and not future.set_running_or_notify_cancel():
                continue
            try:
                result: Any = fn(*args)
                ok = True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request, as run_in_executor does
                result, ok = exc, False
            if step is not None:
                stepped.setdefault(step, []).append((future, ok, result))
            elif isinstance(future, Future):
                _set(future, ok, result)
            else:
                now.append((future, ok, result))
        if now:
            delivery_for(now[0][0].get_loop()).put_many(now)
        for step, outcomes in stepped.items():
            if any(ok for _, ok, _ in outcomes):
                try:
                    step()
                except BaseException as exc:  # noqa: BLE001 - given to every job of the batch that needed it
                    outcomes = [(f, False, copy.copy(exc)) if ok else (f, ok, r) for f, ok, r in outcomes]
            later: list[Outcome] = []
            for future, ok, value in outcomes:
                if isinstance(future, Future):
                    _set(future, ok, value)
                else:
                    later.append((future, ok, value))
            if later:
                delivery_for(later[0][0].get_loop()).put_many(later)


def _set(future: Future[Any], ok: bool, value: Any) -> None:
    """Resolve a concurrent future with a job's outcome."""
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
