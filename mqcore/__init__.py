"""mq's storage protocol and domain: message files moved by POSIX renames. No HTTP here."""

__version__ = "0.1.0"
