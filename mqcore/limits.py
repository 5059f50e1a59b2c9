"""Limits of mq's API that the clients, mqctl and the Spark source share, where no other core module defines them.

Plain constants, no imports: cheap enough for mqctl's start-up. The SQS limits of requests are in
:mod:`mqcore.attributes` (``MAX_WAIT_SECONDS``, ``MAX_RECEIVE_MESSAGES``, ...), the partition limit in
:mod:`mqcore.names` (``MAX_PARTITIONS``).
"""

#: Entries of one batch request by default: mq's default ``--max-batch-messages``, as SQS's batches
#: (SendMessageBatch, DeleteMessageBatch, ChangeMessageVisibilityBatch: at most 10 entries).
DEFAULT_BATCH_MESSAGES = 10
#: Most entries of one batch request that any mq server accepts (``--max-batch-messages`` 1-1,000).
MAX_BATCH_MESSAGES = 1000
#: Most messages one peek page returns (``GET /Q/peek?limit=``, ``Store.peek``).
MAX_PEEK_LIMIT = 1000
#: Messages a peek page returns when no limit is given.
DEFAULT_PEEK_LIMIT = 100
