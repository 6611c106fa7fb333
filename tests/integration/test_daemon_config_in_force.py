"""Which configuration the daemon runs on is never a guess: a --config that does not exist
is refused in one line, the log says at start and at every reload which file is in force
(or that none is, and where it would be), the busy-port hint names that file, and
``hostagentd --check`` finds the daemon systemd runs on a simulated node."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from hostagent.daemon.main import check, service_node
from hostagent.hostroot import HostRoot
from tests.programs import script
from tests.waiting import until

from .agentd import make_root, running_agent


@pytest.mark.parametrize("program", ["hostagentd", "hostagent serve"])
def test_a_config_file_that_does_not_exist_is_refused_in_one_line(make_node, tmp_path, program):
    host, _ = make_node("t4x2")
    argv = [script("hostagentd")] if program == "hostagentd" else [sys.executable, "-m", "hostagent.cli.main",
                                                                   "serve"]
    missing = tmp_path / "typo.yaml"
    done = subprocess.run([*argv, "--simulate", str(host.root), "--config", str(missing)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert f"--config {missing}: no such file (give an existing file, or leave --config out" in line
    assert not host.host("/run/hostagent/hostagent.sock").exists()


def test_the_log_says_which_file_is_in_force_at_start_and_at_each_reload():
    with running_agent(make_root("t4x2")) as agent:
        config = agent.config
        until(lambda: f"configuration: from {config}" in agent.log(), what=agent.log)
        config.unlink()
        agent.signal(signal.SIGHUP)
        until(lambda: f"configuration reloaded: the defaults: there is no {config}" in agent.log(),
              what=agent.log)
        agent.write_config({"daemon": {"resync_interval": 0}})
        agent.signal(signal.SIGHUP)
        until(lambda: f"configuration reloaded: from {config}" in agent.log(), what=agent.log)


def test_a_simulated_nodes_own_config_is_named_without_config():
    """Without --config the daemon on a simulated node reads the node's own file."""
    root = make_root("t4x2")
    with running_agent(root, start=False) as agent:
        agent.config.unlink()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(agent.log_path, "ab") as log:
            agent.proc = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root),
                                           "serve"], stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
        until(lambda: f"configuration: the defaults: there is no {root}/etc/hostagent/config.yaml" in agent.log(),
              what=agent.log)


def test_the_busy_port_hint_names_the_file_in_force():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        with running_agent(make_root("t4x2"), {"metrics": {"address": "127.0.0.1", "port": port}}) as agent:
            until(lambda: "metrics endpoint not served" in agent.log(), what=agent.log)
            assert f"choose another metrics.port in {agent.config}," in agent.log()
    finally:
        taken.close()


def test_check_asks_the_simulated_node_systemds_service_runs(capsys):
    if HostRoot().host("/run/hostagent/hostagent.sock").exists():
        pytest.skip("a hostagent daemon's socket is at /run/hostagent on this machine")
    with running_agent(make_root("t4x2")) as agent:
        root = str(agent.root)
        assert check(HostRoot(), find_service_node=lambda: root) == 0
        out = capsys.readouterr().out
        assert f"answers on {agent.socket}, its work moves (the simulated node {root} of hostagent.service" in out
        assert f"hostagentd --check --simulate {root}" in out
    # The service's node without a daemon: the message says which one was asked.
    assert check(HostRoot(), find_service_node=lambda: root) == 1
    assert f"the simulated node {root} of hostagent.service" in capsys.readouterr().err
    # No service on a simulated node: the host's own socket, as before.
    assert check(HostRoot(), find_service_node=lambda: None) == 1
    assert "the hostagent daemon is not running" in capsys.readouterr().err


def test_service_node_reads_the_units_environment(tmp_path):
    def systemctl(state, env):
        def run(argv, **kw):
            assert argv[:3] == ["systemctl", "show", "hostagent.service"]
            return subprocess.CompletedProcess(argv, 0, f"ActiveState={state}\nEnvironment={env}\n", "")
        return run
    assert service_node(systemctl("active", "HOSTAGENT_SIMULATE=/srv/sim LANG=C")) == "/srv/sim"
    assert service_node(systemctl("active", '"HOSTAGENT_SIMULATE=/srv/a b"')) == "/srv/a b"
    assert service_node(systemctl("inactive", "HOSTAGENT_SIMULATE=/srv/sim")) is None
    assert service_node(systemctl("active", "LANG=C")) is None
