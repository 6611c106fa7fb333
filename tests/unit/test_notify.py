"""The notify protocol's status: a loop reporting each pass sends only what changed."""

import socket

from hostagent.daemon.notify import Notifier


def test_status_changed_sends_a_status_once_until_it_changes(tmp_path):
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.settimeout(0.5)
        n = Notifier({"NOTIFY_SOCKET": str(path)})
        n._send = n._datagram              # the protocol itself, systemd-python or not
        assert n.status_changed("one") and not n.status_changed("one")
        assert n.status_changed("two") and n.status_changed("one")
        assert [s.recv(100) for _ in range(3)] == [b"STATUS=one", b"STATUS=two", b"STATUS=one"]
        assert not Notifier({}).status_changed("outside systemd")
