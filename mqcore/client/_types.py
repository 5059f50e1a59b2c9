"""Old private name of :mod:`mqcore.client.types`, kept while ``mqcore/client/_local.py`` still imports it.

Import :mod:`mqcore.client.types` (public) instead; this module goes once no module of mq uses it.
"""

from mqcore.client.types import (
    JSON_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    BatchEntry,
    Message,
    MessageState,
    PeekedMessage,
    PeekPage,
)

__all__ = [
    "JSON_CONTENT_TYPE",
    "TEXT_CONTENT_TYPE",
    "BatchEntry",
    "Message",
    "MessageState",
    "PeekPage",
    "PeekedMessage",
]
