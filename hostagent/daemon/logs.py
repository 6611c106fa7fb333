"""Structured logging: to the journal under systemd, to stderr otherwise.

A record's ``extra={"fields": {...}}`` becomes journal fields (``ALLOCATION_ID=...``) or
``key=value`` pairs after the message on stderr. Under systemd (``$JOURNAL_STREAM`` names
our stderr) records go through systemd-python's JournalHandler when installed, else the
journal's native datagram protocol, else stderr lines with ``<N>`` priority prefixes, which
journald understands.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys

__all__ = ["setup_logging", "set_level", "under_journal", "NativeJournalHandler"]

JOURNAL_SOCKET = "/run/systemd/journal/socket"
# syslog priorities of logging's levels
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def _priority(levelno: int) -> int:
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _PRIORITY[level]
    return 7


def under_journal(environ=os.environ, stream=sys.stderr) -> bool:
    """True when stderr is the journal stream systemd connected (sd_journal_stream_fd)."""
    value = environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def _fields(record) -> dict:
    return getattr(record, "fields", None) or {}


class KeyValueFormatter(logging.Formatter):
    """``message key=value ...`` with an optional ``<N>`` journald priority prefix."""

    def __init__(self, prefix_priority: bool, identifier: str = "hostagentd"):
        super().__init__()
        self.prefix_priority = prefix_priority
        self.identifier = identifier

    def format(self, record):
        text = record.getMessage()
        pairs = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if pairs:
            text = f"{text} {pairs}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if self.prefix_priority:
            return "\n".join(f"<{_priority(record.levelno)}>{line}" for line in text.splitlines())
        return f"{self.identifier}: {record.levelname.lower()}: {text}"


class NativeJournalHandler(logging.Handler):
    """The journal's native protocol: KEY=value lines in one datagram (binary-safe form for
    values with newlines), as sd_journal_send does."""

    def __init__(self, address: str = JOURNAL_SOCKET, identifier: str = "hostagentd"):
        super().__init__()
        self.address = address
        self.identifier = identifier
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @staticmethod
    def _item(key: str, value) -> bytes:
        data = str(value).encode("utf-8", "replace")
        key_b = key.upper().encode("ascii", "replace")
        if b"\n" in data:
            return key_b + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        return key_b + b"=" + data + b"\n"

    def emit(self, record):
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            items = [("MESSAGE", message), ("PRIORITY", _priority(record.levelno)),
                     ("SYSLOG_IDENTIFIER", self.identifier), ("LOGGER", record.name),
                     ("CODE_FILE", record.pathname), ("CODE_LINE", record.lineno),
                     ("CODE_FUNC", record.funcName)]
            items += [(k, v) for k, v in _fields(record).items()]
            self.sock.sendto(b"".join(self._item(k, v) for k, v in items), self.address)
        except OSError:
            self.handleError(record)


def _journal_handler(identifier: str) -> logging.Handler:
    try:
        from systemd.journal import JournalHandler

        class FieldsJournalHandler(JournalHandler):
            def emit(self, record):
                for k, v in _fields(record).items():
                    setattr(record, k.upper(), v)   # JournalHandler sends upper-case attributes
                super().emit(record)
        return FieldsJournalHandler(SYSLOG_IDENTIFIER=identifier)
    except ImportError:
        pass
    if os.path.exists(JOURNAL_SOCKET):
        return NativeJournalHandler(identifier=identifier)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(prefix_priority=True, identifier=identifier))
    return handler


def setup_logging(level: str = "info", *, journal: bool | None = None,
                  identifier: str = "hostagentd") -> logging.Handler:
    """``identifier``: the program's name in the journal and on stderr lines."""
    journal = under_journal() if journal is None else journal
    if journal:
        handler = _journal_handler(identifier)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(KeyValueFormatter(prefix_priority=False, identifier=identifier))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    return handler


def set_level(level: str) -> None:
    logging.getLogger().setLevel(getattr(logging, level.upper(), logging.INFO))
