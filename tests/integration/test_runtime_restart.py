"""--restart: systemctl under systemd, SIGHUP to containerd's socket owner without it."""

import os
import signal
import subprocess
import sys

import pytest

from hostagent.cli.main import main

LISTENER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
print("ready", flush=True)
while True:
    conn, _ = s.accept()
"""


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "r"
    for d in ("etc/containerd", "etc/docker", "run"):
        (root / d).mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text('version = 2\n[grpc]\n  address = "/run/c.sock"\n')
    return root


@pytest.fixture
def systemctl(tmp_path, monkeypatch):
    """A fake systemctl first in PATH that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "systemctl.args"
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\n[ -z \"$FAIL\" ] || {{ echo 'Unit failed.' >&2; exit 1; }}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return record


def configure(root, tmp_path, runtime):
    return main(["--simulate", str(root), "runtime", "configure", "--runtime", runtime, "--restart",
                 "--backup-dir", str(tmp_path / "b")])


def test_systemd_restarts_the_unit(root, tmp_path, systemctl, capsys):
    (root / "run/systemd/system").mkdir(parents=True)
    assert configure(root, tmp_path, "docker") == 0
    assert systemctl.read_text() == "restart docker\n"
    assert "restarted docker through systemd" in capsys.readouterr().out


def test_systemctl_failure_is_reported(root, tmp_path, systemctl, capsys, monkeypatch):
    (root / "run/systemd/system").mkdir(parents=True)
    monkeypatch.setenv("FAIL", "1")
    assert configure(root, tmp_path, "containerd") == 1
    err = capsys.readouterr().err
    assert "systemctl restart containerd failed: Unit failed." in err and "the configuration is written" in err


def test_without_systemd_docker_cannot_be_restarted(root, tmp_path, systemctl, capsys):
    assert configure(root, tmp_path, "docker") == 1
    assert "restart docker yourself" in capsys.readouterr().err
    assert not systemctl.exists()


def test_without_systemd_containerd_gets_sighup(root, tmp_path, systemctl, capsys):
    sock = root / "run/c.sock"
    listener = subprocess.Popen([sys.executable, "-c", LISTENER, str(sock)], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline() == "ready\n"
        assert configure(root, tmp_path, "containerd") == 0
        assert listener.wait(10) == -signal.SIGHUP
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    out = capsys.readouterr().out
    assert f"sent SIGHUP to containerd (pid {listener.pid})" in out and "supervisor" in out
    assert not systemctl.exists()


def test_without_systemd_and_no_containerd(root, tmp_path, systemctl, capsys):
    assert configure(root, tmp_path, "containerd") == 1
    assert "c.sock: cannot connect" in capsys.readouterr().err
