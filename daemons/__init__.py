"""The three asyncio processes (mq, mq-mover, mq-reaper): thin wiring over mqcore."""
