"""systemd's readiness protocol: READY=1, STATUS=..., WATCHDOG=1, STOPPING=1, RELOADING=1.

Through systemd-python's ``systemd.daemon.notify`` when it is installed, else the protocol
itself: one datagram to the AF_UNIX socket in ``$NOTIFY_SOCKET`` (a leading ``@`` names the
abstract namespace). Outside systemd (no ``$NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import os
import socket

__all__ = ["Notifier", "watchdog_interval"]


class Notifier:
    def __init__(self, environ=os.environ):
        self.address = environ.get("NOTIFY_SOCKET") or None
        self._send = None
        if self.address is None:
            return
        try:
            from systemd import daemon as sd   # optional dependency (extra "systemd")
            self._send = lambda text: sd.notify(text)
        except ImportError:
            self._send = self._datagram

    @property
    def enabled(self) -> bool:
        return self._send is not None

    def _datagram(self, text: str) -> bool:
        address = self.address
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(text.encode(), address)
            return True
        except OSError:
            return False    # systemd gone or socket unreachable: nothing a daemon can do

    def notify(self, **fields) -> bool:
        """``notify(ready=1, status="...")`` sends ``READY=1\\nSTATUS=...``."""
        if self._send is None:
            return False
        text = "\n".join(f"{k.upper()}={str(v).replace(chr(10), ' ')}" for k, v in fields.items())
        return bool(self._send(text))

    def ready(self, status: str) -> bool:
        return self.notify(ready=1, status=status, mainpid=os.getpid())

    def status(self, status: str) -> bool:
        return self.notify(status=status)

    def status_changed(self, status: str) -> bool:
        """STATUS=... when it is not the last status this notifier sent (a loop reporting
        each pass says only what changed)."""
        if status == getattr(self, "_last_status", None):
            return False
        self._last_status = status
        return self.status(status)

    def watchdog(self) -> bool:
        return self.notify(watchdog=1)

    def reloading(self) -> bool:
        return self.notify(reloading=1, status="reloading configuration")

    def stopping(self) -> bool:
        return self.notify(stopping=1, status="stopping")


def watchdog_interval(environ=os.environ) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when not asked for.
    ``WATCHDOG_PID``, when set, must name this process."""
    usec = environ.get("WATCHDOG_USEC")
    pid = environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 1e6 / 2, 0.05)
    except ValueError:
        return None
