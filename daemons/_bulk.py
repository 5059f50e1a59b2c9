"""Bulk leases in the ``mq`` daemon (issue 17, docs/protocol.md 20): ``POST``/``DELETE /{queue}/leases/{key}``.

The rules are :mod:`mqcore.service.bulk`'s plans; this module drives them on
the daemon: the record's file work on a saver thread, the new leases as a
receive makes them (:meth:`daemons._broker.Broker._lease_some`: the queue's
index, its fetcher thread, the memory of leases), a retry's re-let as a
retried receive attempt's (:meth:`daemons._broker.Broker._relet`), the deletes as a batch of
deletes by receipt handle (:meth:`daemons._leases.Leases.delete_by_handles`:
the remover thread, one fsync of ``remove/``). Requests with the same
``(queue, key)`` run one after the other in this process, so a retry that
arrives while the first try runs gets its record.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from daemons._answers import received_json
from daemons._broker import Broker
from daemons._http import BROKER, read_json
from daemons._shapes import check_keys
from mqcore.errors import InvalidRequest, MQError
from mqcore.names import QueueName, check_queue_name, is_fifo_queue
from mqcore.service import fifo
from mqcore.service.attempts import KeyedLocks, Relet
from mqcore.service.bulk import (
    BulkArgs,
    BulkDeleted,
    BulkLeased,
    DeleteHandles,
    LeaseNew,
    bulk_delete,
    bulk_lease,
    check_bulk_lease,
)
from mqcore.service.plans import run_async
from mqcore.service.requests import ReceiveRequest

__all__ = ["BULK_LEASE_ROUTE", "BulkLeases", "add_routes"]

#: The route of a bulk lease (``POST``: lease or replay; ``DELETE``: delete everything leased under the key).
BULK_LEASE_ROUTE = "/{queue}/leases/{key}"
#: The keys of a bulk lease's JSON body.
_LEASE_KEYS = ("max_messages", "visibility_timeout_seconds")
#: ``max_messages`` when the body leaves it out.
DEFAULT_BULK_MESSAGES = 10


class BulkLeases:
    """The daemon's bulk leases: one per broker, made on first use (:func:`bulk_of`).

    Args:
        broker: The daemon's broker (event loop only).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._locks: KeyedLocks[asyncio.Lock] = KeyedLocks(asyncio.Lock)

    async def lease(self, queue: QueueName, args: BulkArgs) -> BulkLeased:
        """Lease up to ``args.max_messages`` under ``args.key``, or replay the key's record (no waiting).

        Raises:
            InvalidRequest: A FIFO queue (bulk leases take no message group order).
            QueueNotFound: No such queue.
            StorageUnavailable: A lease, a read or the record's write failed.
        """
        if is_fifo_queue(queue):
            raise InvalidRequest("bulk leases are for standard queues, not FIFO queues", queue=queue)
        state = await self.broker.receive_state(queue)
        request = args.resolve(queue, state.attrs)
        # Shielded: a client that disconnects (aiohttp cancels its handler) must not leave leases made
        # without their record; finished, the record lets the client's retry re-let them.
        return await asyncio.shield(self._lease_recorded(queue, args, request))

    async def _lease_recorded(self, queue: QueueName, args: BulkArgs, request: ReceiveRequest) -> BulkLeased:
        """The plan of a bulk lease under the key's lock (:meth:`lease`)."""
        broker = self.broker
        async with self._locks.holding_async((queue, args.key)):
            return await run_async(bulk_lease(broker.store, queue, args, request), broker.in_saver, self._step)

    async def delete(self, queue: QueueName, key: str) -> BulkDeleted:
        """Delete every message leased under ``key`` (its record's leases), then its record.

        Raises:
            InvalidRequest: ``key`` is not a lease key.
            StorageUnavailable: A delete, the fsync of ``remove/`` or the record's unlink failed.
        """
        async with self._locks.holding_async((queue, key)):
            return await run_async(bulk_delete(self.broker.store, queue, key), self.broker.in_saver, self._step)

    async def _step(self, op: LeaseNew | Relet | DeleteHandles) -> Any:
        """An operation of the plans: new leases as a receive makes them, a retry's re-let, or deletes by handle."""
        if isinstance(op, LeaseNew):
            return await self.broker._lease_some(op.request, check_exists=True)
        if isinstance(op, Relet):
            return await self.broker._relet(op.request, op.handles)
        results = await self.broker.leases.delete_by_handles(op.queue, op.handles)
        return [r if isinstance(r, MQError) else None for r in results]


_BULK = web.AppKey("mq_bulk_leases", BulkLeases)


def bulk_of(app: web.Application) -> BulkLeases:
    """The app's :class:`BulkLeases` (made by :func:`add_routes`)."""
    return app[_BULK]


async def lease_bulk(request: web.Request) -> web.Response:
    """POST /<queue>/leases/<key> {"max_messages": 1-10000, "visibility_timeout_seconds": 1-43200} -> 200
    {"key", "replayed", "messages": [...]} (the entries of a batch receive; docs/api.md "Bulk leases")."""
    queue = check_queue_name(request.match_info["queue"])
    key = request.match_info["key"]
    body = await read_json(request, required=False)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", where="body")
    check_keys(body, _LEASE_KEYS, "body")
    args = check_bulk_lease(
        key, body.get("max_messages", DEFAULT_BULK_MESSAGES), body.get("visibility_timeout_seconds")
    )
    leased = await bulk_of(request.app).lease(queue, args)
    items = ", ".join(received_json(m, fifo.native_fields(m)) for m in leased.messages)  # one receive's items
    replayed = "true" if leased.replayed else "false"
    text = f'{{"key": {json.dumps(leased.key)}, "replayed": {replayed}, "messages": [{items}]}}'
    return web.Response(text=text, content_type="application/json")


async def delete_bulk(request: web.Request) -> web.Response:
    """DELETE /<queue>/leases/<key> -> 200 {"key", "found", "deleted", "missing"} (docs/api.md "Bulk leases")."""
    queue = check_queue_name(request.match_info["queue"])
    key = request.match_info["key"]
    check_bulk_lease(key, 1)
    out = await bulk_of(request.app).delete(queue, key)
    return web.json_response({"key": out.key, "found": out.found, "deleted": out.deleted, "missing": out.missing})


def add_routes(app: web.Application) -> None:
    """Register the bulk lease routes and their state on ``app`` (``daemons.front.make_app``, after ``app[BROKER]``)."""
    app[_BULK] = BulkLeases(app[BROKER])
    app.router.add_post(BULK_LEASE_ROUTE, lease_bulk)
    app.router.add_delete(BULK_LEASE_ROUTE, delete_bulk)
