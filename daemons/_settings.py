"""Settings of the ``mq`` daemon: the frozen, checked dataclass the CLI builds and the broker reads.

A module of its own so that ``daemons/_broker.py`` (which reads the settings)
and ``daemons/front.py`` (which builds them from the command line, and imports
the broker) do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemons import _runtime
from daemons._inline import INLINE_IO_MODES
from daemons._savers import FILE_SYNC_MODES
from daemons._stopguard import DEFAULT_STOP_TIMEOUT_SECONDS
from mqcore.attributes import MAX_MESSAGE_BYTES, MAX_VISIBILITY_TIMEOUT_SECONDS, QueueAttributes
from mqcore.errors import ConfigError
from mqcore.limits import DEFAULT_BATCH_MESSAGES, MAX_BATCH_MESSAGES

#: Default maximum body size, in bytes (SQS: 1 MiB).
DEFAULT_MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES
#: Default and largest --max-batch-messages (entries of a batch send; SQS: 10).
DEFAULT_MAX_BATCH_MESSAGES = DEFAULT_BATCH_MESSAGES
MAX_BATCH_MESSAGES_LIMIT = MAX_BATCH_MESSAGES
#: Bytes a batch send's JSON may use per entry beyond its body and attributes (id, keys, content type).
BATCH_ENTRY_OVERHEAD_BYTES = 4096
#: JSON escapes (``\\u0000``) make a ``body`` string up to 6 bytes per body byte.
JSON_EXPANSION = 6
#: Most ``--processes`` (mq processes serving one port and root; docs/api.md "Several mq processes").
MAX_PROCESSES = 256


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings of the ``mq`` daemon (checked on construction)."""

    root: str = "/tmp/mq"
    """Root directory of the folder tree (created if missing)."""
    address: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8080
    """TCP port; 0 picks a free one (logged in the readiness line)."""
    workers: int = 8
    """Threads of each kind, started as work needs them: up to N savers and N fetchers (SoftLayer MQ: --workers, 8)."""
    peers: int = 0
    """Receive picks at random among the oldest peers+1 ready messages (0 = strict FIFO)."""
    visibility_timeout_seconds: int = 30
    """Default visibility timeout of a queue, in seconds (SQS: 0-43200, default 30)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest accepted body, in bytes (default 1 MiB = 1,048,576 bytes, as SQS); caps every queue's limit."""
    max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES
    """Most entries of a batch send (default 10, as SQS SendMessageBatch; 1-1000)."""
    rescan_interval_seconds: float = 10.0
    """Seconds between listings of each active queue (catches changes inotify cannot see, e.g. over NFS)."""
    log_level: str = "INFO"
    """Logging level name."""
    access_log: bool = False
    """Log one line per HTTP request on the ``mq.access`` logger (costs ~20% of send throughput)."""
    sqs_account_id: str = "000000000000"
    """Account id in the queue URLs and ARNs of the SQS protocol (12 digits; docs/sqs.md)."""
    sqs_region: str = "us-east-1"
    """Region in the ARNs of the SQS protocol (docs/sqs.md)."""
    sqs_credentials: str = ""
    """JSON file of access key id -> secret key: SQS requests must carry a valid SigV4 signature ("" = any)."""
    auth_file: str = ""
    """TOML file of hashed tokens and their grants (daemons._auth); empty = no authentication."""
    insecure_listen: bool = False
    """Allow a non-loopback address without ``auth_file`` (docs/security.md)."""
    tls_cert: str = ""
    """PEM certificate chain for HTTPS; empty = plain HTTP."""
    tls_key: str = ""
    """PEM private key of ``tls_cert``."""
    max_connections: int = 1024
    """Most open client connections; one more is answered 503 server_busy and closed."""
    idle_timeout_seconds: float = 75.0
    """Seconds a connection may go without a complete request header (idle keep-alive or slow headers)."""
    body_timeout_seconds: float = 60.0
    """Seconds a request body may take to arrive (408 request_timeout after)."""
    max_waiters: int = 1000
    """Most long polls waiting on one queue at once (503 server_busy beyond)."""
    metrics_max_queues: int = 1000
    """Queues named in ``/metrics`` labels; the others are summed under ``queue="_other"`` (docs/metrics.md)."""
    min_free_bytes: int = 0
    """Free bytes of the root's filesystem below which sends get 507 and ``/readyz`` 503 (0 = only when full)."""
    processes: int = 1
    """mq processes serving the port (1 = this one; more: a supervisor and N workers, daemons._processes)."""
    inline_io: str = "auto"
    """``auto``: a lone send, receive or delete does its file work on the event loop, on a local
    filesystem only (daemons._inline); ``never``: always on the worker threads."""
    file_sync: str = "auto"
    """How a send's file data is made durable before its rename: ``fsync`` each file; ``syncfs``: one
    ``syncfs`` per group of files, on a local filesystem only (daemons._savers); ``auto``: ``syncfs``
    while more sends are in flight than ``workers`` and little of the machine's dirty data is not mq's
    (daemons._savers.FOREIGN_DIRTY_LIMIT)."""
    stop_timeout_seconds: float = DEFAULT_STOP_TIMEOUT_SECONDS
    """Seconds after SIGTERM within which mq exits even with a thread stuck in the filesystem (exit 69,
    daemons._stopguard)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}", key="port")
        if not 1 <= self.workers <= 1024:
            raise ConfigError(f"workers must be 1-1024, got {self.workers}", key="workers")
        _runtime.positive("peers", self.peers, allow_zero=True)
        if not 0 <= self.visibility_timeout_seconds <= MAX_VISIBILITY_TIMEOUT_SECONDS:
            raise ConfigError(
                f"visibility-timeout must be 0-{MAX_VISIBILITY_TIMEOUT_SECONDS} seconds (as SQS), "
                f"got {self.visibility_timeout_seconds}",
                key="visibility_timeout",
            )
        _runtime.positive("max-message-size", self.max_message_bytes)
        if not 1 <= self.max_batch_messages <= MAX_BATCH_MESSAGES_LIMIT:
            raise ConfigError(
                f"max-batch-messages must be 1-{MAX_BATCH_MESSAGES_LIMIT}, got {self.max_batch_messages}",
                key="max_batch_messages",
            )
        _runtime.positive("rescan-interval", self.rescan_interval_seconds)
        if not (len(self.sqs_account_id) == 12 and self.sqs_account_id.isascii() and self.sqs_account_id.isdigit()):
            raise ConfigError(f"sqs-account-id must be 12 digits, got {self.sqs_account_id!r}", key="sqs_account_id")
        if not self.sqs_region or not all(c.isascii() and (c.isalnum() or c == "-") for c in self.sqs_region):
            raise ConfigError(f"sqs-region must be letters, digits and '-', got {self.sqs_region!r}", key="sqs_region")
        if self.sqs_credentials:
            try:
                from daemons._sigv4 import load_credentials  # botocore is imported only when signatures are checked
            except ImportError:
                raise ConfigError(
                    "sqs-credentials needs botocore: pip install 'mq[sqs]'", key="sqs_credentials"
                ) from None
            load_credentials(self.sqs_credentials)  # ConfigError (exit 78) at start for a bad file
        if not 1 <= self.max_connections <= 1_000_000:
            raise ConfigError(f"max-connections must be 1-1000000, got {self.max_connections}", key="max_connections")
        _runtime.check_interval("idle-timeout", self.idle_timeout_seconds)
        _runtime.check_interval("body-timeout", self.body_timeout_seconds)
        _runtime.positive("max-waiters", self.max_waiters)
        _runtime.positive("metrics-max-queues", self.metrics_max_queues, allow_zero=True)
        _runtime.positive("min-free-bytes", self.min_free_bytes, allow_zero=True)
        if self.inline_io not in INLINE_IO_MODES:
            raise ConfigError(f"inline-io must be auto or never, got {self.inline_io!r}", key="inline_io")
        if self.file_sync not in FILE_SYNC_MODES:
            raise ConfigError(f"file-sync must be auto, fsync or syncfs, got {self.file_sync!r}", key="file_sync")
        _runtime.check_interval("stop-timeout", self.stop_timeout_seconds)
        if not 1 <= self.processes <= MAX_PROCESSES:
            raise ConfigError(f"processes must be 1-{MAX_PROCESSES} or auto, got {self.processes}", key="processes")

    @property
    def queue_defaults(self) -> QueueAttributes:
        """The attributes of a queue that sets none (``--visibility-timeout``, ``--max-message-size``)."""
        return QueueAttributes(
            visibility_timeout_seconds=self.visibility_timeout_seconds, max_message_bytes=self.max_message_bytes
        )

    @property
    def batch_request_limit_bytes(self) -> int:
        """Largest JSON body of a batch send, in bytes: bodies and attributes with JSON escapes, plus overhead."""
        return JSON_EXPANSION * self.max_message_bytes + BATCH_ENTRY_OVERHEAD_BYTES * self.max_batch_messages
