"""Names renamed to the glossary's words (docs/glossary.md) still work for one release, with a warning."""

from __future__ import annotations

import asyncio

import pytest

from mqcore.client import AsyncLocalClient, LocalClient


def test_the_old_timeout_seconds_keyword_still_changes_visibility_and_warns(tmp_path):
    with LocalClient(tmp_path) as mq:
        mq.create_queue("jobs")
        mq.send("jobs", b"x")
        (message,) = mq.receive("jobs", visibility_timeout_seconds=600)
        with pytest.warns(DeprecationWarning, match="visibility_timeout_seconds="):
            mq.change_visibility("jobs", message.receipt_handle, timeout_seconds=0)
        (again,) = mq.receive("jobs")  # given back at once, as visibility_timeout_seconds=0 does
        assert again.message_id == message.message_id and again.receive_count == 2
        (peeked,) = mq.peek("jobs").messages
        with pytest.warns(DeprecationWarning, match="visibility_deadline_ms"):
            assert peeked.visible_at_ms == peeked.visibility_deadline_ms == again.visibility_deadline_ms
        with pytest.raises(TypeError):
            mq.change_visibility("jobs", again.receipt_handle, timeout_seconds=0, visibility_timeout_seconds=0)


def test_the_async_clients_take_the_old_keyword_too(tmp_path):
    async def main() -> int:
        async with AsyncLocalClient(tmp_path) as mq:
            await mq.create_queue("jobs")
            await mq.send("jobs", b"x")
            (message,) = await mq.receive("jobs", visibility_timeout_seconds=600)
            with pytest.warns(DeprecationWarning, match="visibility_timeout_seconds="):
                await mq.change_visibility("jobs", message.receipt_handle, timeout_seconds=0)
            return len(await mq.receive("jobs"))

    assert asyncio.run(main()) == 1
