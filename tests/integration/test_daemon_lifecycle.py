"""The daemon as systemd runs it: readiness and watchdog notifications, reload, stop,
journal logging, one instance per node, an unreadable inventory at start."""

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest

from hostagent.client import Request
from hostagent.errors import UnavailableError
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import ABSENT_GROUP, AgentProcess, make_root, running_agent


class NotifySocket:
    """What systemd's notification socket receives."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path if not path.startswith("@") else "\0" + path[1:])
        self.sock.settimeout(10)
        self.messages: list[dict] = []

    def wait_for(self, key: str, value: str | None = None) -> dict:
        for m in self.messages:
            if key in m and (value is None or m[key] == value):
                self.messages.remove(m)
                return m
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            data = self.sock.recv(4096).decode()
            m = dict(line.split("=", 1) for line in data.splitlines())
            if key in m and (value is None or m[key] == value):
                return m
            self.messages.append(m)
        raise AssertionError(f"no {key} notification; got {self.messages}")

    def wait_for_status(self, prefix: str) -> str:
        """The first STATUS that starts with ``prefix``; those before it (a start-up step
        that finished late, a step of the change) are passed over."""
        seen = []
        while True:
            try:
                status = self.wait_for("STATUS")["STATUS"]
            except (AssertionError, TimeoutError) as e:
                raise AssertionError(f"no status starting {prefix!r}; got {seen}") from e
            if status.startswith(prefix):
                return status
            seen.append(status)

    def pending(self) -> list[dict]:
        """Every message not yet taken (call once the sender has exited)."""
        self.sock.setblocking(False)
        try:
            while True:
                data = self.sock.recv(4096).decode()
                self.messages.append(dict(line.split("=", 1) for line in data.splitlines()))
        except BlockingIOError:
            pass
        self.sock.setblocking(True)
        self.sock.settimeout(10)
        return self.messages

    def close(self):
        self.sock.close()


@pytest.fixture
def root():
    r = make_root()
    yield r


def test_notify_ready_watchdog_reload_stop(root, tmp_path):
    notify = NotifySocket("@hostagent-test-%d" % os.getpid())     # abstract namespace
    agent = AgentProcess(root, env={"NOTIFY_SOCKET": "@hostagent-test-%d" % os.getpid(),
                                    "WATCHDOG_USEC": "200000"})
    try:
        agent.start()
        ready = notify.wait_for("READY", "1")
        assert ready["MAINPID"] == str(agent.proc.pid)
        assert ready["STATUS"].startswith("serving 8 GPU(s), 0 MIG device(s), 0 allocation(s) on ")
        for _ in range(3):                                  # every 0.1 s
            notify.wait_for("WATCHDOG", "1")

        # A good reload takes effect: a smaller body limit.
        agent.write_config({"api": {"max_body_bytes": 1024}})
        agent.signal(signal.SIGHUP)
        notify.wait_for("RELOADING", "1")
        notify.wait_for("READY", "1")
        body = b'{"id": "x", "devices": [{"device": "1"}], "labels": {"a": "' + b"b" * 1100 + b'"}}'
        with agent.client() as c:
            assert c.transport.handle_request(Request("POST", "/v1/allocations", body)).status == 413

        # A bad one is refused, says why, and the previous configuration stays.
        agent.write_config({"api": {"max_body_bytes": "lots"}, "daemon": {"colour": 1}})
        agent.signal(signal.SIGHUP)
        notify.wait_for("RELOADING", "1")
        again = notify.wait_for("READY", "1")
        assert "last reload failed" in again["STATUS"]
        log = agent.log()
        assert "configuration not reloaded, the previous one stays in force" in log
        assert "api.max_body_bytes" in log and "daemon" in log and "colour" in log
        with agent.client() as c:
            assert c.transport.handle_request(Request("POST", "/v1/allocations", body)).status == 413
            assert c.node()["gpus"] == 8

        agent.signal(signal.SIGTERM)
        notify.wait_for("STOPPING", "1")
        assert agent.proc.wait(10) == 0
        assert not agent.socket.exists()
    finally:
        notify.close()
        agent.cleanup()


def test_journal_stream_lines_carry_priorities(root):
    agent = AgentProcess(root)
    agent.log_path.touch()
    st = os.stat(agent.log_path)
    agent.env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    try:
        agent.start()
        agent.stop()
        lines = [l for l in agent.log().splitlines() if l]
        assert lines and all(l[0] == "<" and l[2] == ">" for l in lines), lines
        assert any(l.startswith(f"<4>group '{ABSENT_GROUP}' does not exist") for l in lines)
        assert any(l.startswith("<6>listening on ") for l in lines)
    finally:
        agent.cleanup()


def test_native_journal_protocol(tmp_path):
    import logging
    from hostagent.daemon.logs import NativeJournalHandler
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "journal"))
    handler = NativeJournalHandler(str(tmp_path / "journal"))
    logger = logging.getLogger("test.journal")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("two\nlines", extra={"fields": {"allocation_id": "a/b"}})
        data = server.recv(65536)
    finally:
        logger.removeHandler(handler)
        server.close()
    # MESSAGE has a newline: the binary-safe form, KEY\n<le64 length><value>\n.
    assert b"MESSAGE\n" + (9).to_bytes(8, "little") + b"two\nlines\n" in data
    assert b"PRIORITY=4\n" in data and b"ALLOCATION_ID=a/b\n" in data
    assert b"SYSLOG_IDENTIFIER=hostagentd\n" in data


def test_one_daemon_per_node_and_root_only_socket_without_group(root):
    with running_agent(root) as first:
        # The API group does not exist: root-only socket, and the log says so.
        assert stat.S_IMODE(os.stat(first.socket).st_mode) == 0o600
        assert f"group '{ABSENT_GROUP}' does not exist: the API socket is root-only" in first.log()
        second = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "--simulate", str(root),
                                 "serve", "--config", str(first.config)], capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 1
        assert f"another hostagent daemon (pid {first.proc.pid}) is running" in second.stderr
        with first.client() as c:
            assert c.node()["gpus"] == 8


def test_bad_config_at_start_exits_with_the_reason(root):
    agent = AgentProcess(root, "api: {socket_mode: 999}\n")
    agent.start(wait=False)
    assert agent.proc.wait(20) == 1
    assert "cannot start" in agent.log() and "api.socket_mode" in agent.log()
    agent.cleanup()


def test_socket_that_cannot_be_made_is_a_clear_error(root):
    agent = AgentProcess(root, {"api": {"socket": "/run/" + "x" * 120 + "/s.sock"}})
    agent.start(wait=False)
    assert agent.proc.wait(20) == 1
    assert "cannot create the API socket: AF_UNIX path too long" in agent.log()
    agent.cleanup()


@pytest.mark.root("a read-only bind mount needs root (in a mount namespace of its own)")
@pytest.mark.parametrize("program", [["hostagent.daemon.main"], ["hostagent.cli.main", "serve"]])
def test_a_node_the_daemon_may_not_write_is_one_line_naming_it_and_the_fix(root, program):
    """As under systemd's ProtectSystem=strict without ReadWritePaths= for a simulated node,
    or in the image with a read-only /host."""
    name = "hostagentd" if program[0] == "hostagent.daemon.main" else "hostagent"
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh", str(root),
                           sys.executable, "-m", program[0], "--simulate", str(root), *program[1:]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == (
        f"{name}: error: cannot start: {root}/run/hostagent: Read-only file system; the daemon may not write "
        "there: under systemd, a drop-in gives it the folder (for a simulated node, ReadWritePaths= with its "
        "folder: see docs/install.md); in a container, mount it read-write"), done.stderr
    assert "Traceback" not in done.stderr


def test_unreadable_inventory_at_start_then_recovery(root):
    subprocess.run([sys.executable, "-m", "hostagent.cli.main", "sim", "driver", "unload", "--root", str(root)],
                   check=True, capture_output=True)
    port = _free_port()
    with running_agent(root, {"metrics": {"port": port}}) as agent:
        with agent.client() as c:
            node = c.node()
            assert node["inventory"]["state"] == "error" and node["inventory"]["code"] == "driver_not_loaded"
            assert c.devices()["gpus"] == []
            with pytest.raises(UnavailableError) as e:
                c.allocate("early", ["0"])
            assert e.value.status == 503
            with pytest.raises(UnavailableError):
                c.request("GET", "/v1/labels")                  # nothing to label yet
            # The metrics are served all the same, on the socket and on TCP: the driver's
            # state, and what could not be read.
            over_tcp = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            for text in (c.metrics(), over_tcp):
                assert "hostagent_driver_ready 0.0" in text
                assert 'hostagent_driver_check{check="kernel-module",result="fail"} 1.0' in text
                assert 'hostagent_scrape_collector_success{collector="inventory"} 0.0' in text
                assert 'hostagent_scrape_collector_success{collector="gpu"} 0.0' in text
                assert "DCGM_FI_DEV_GPU_TEMP" not in text
            # Without a layout configured, the log says what waits, not "layout None".
            assert "no MIG layout is configured (mig.config); the check for an interrupted MIG apply waits " \
                   "(start): " in agent.log() and "None" not in agent.log()
            subprocess.run([sys.executable, "-m", "hostagent.cli.main", "sim", "driver", "load", "--root",
                            str(root)], check=True, capture_output=True)
            c.refresh()
            assert c.node()["inventory"]["state"] == "ok"
            assert len(c.devices()["gpus"]) == 8
            assert c.allocate("later", ["0"])["devices"]
            # the monitor and the sampler start with the first readable inventory
            until(lambda: {g["health"]["state"] for g in c.devices()["gpus"]} == {"healthy"}, 15,
                  lambda: c.devices()["gpus"][0]["health"], interval=0.1)
            assert c.health()["running"]
            # The sampler starts after the monitor and takes its first sample on its own
            # thread: /metrics may be unavailable, then without GPU series, for a moment.
            text = until(lambda: t if "DCGM_FI_DEV_GPU_TEMP{" in (t := _metrics_or_why_not(c)) else None, 15,
                         lambda: _metrics_or_why_not(c), interval=0.1)
            assert 'hostagent_scrape_collector_success{collector="inventory"} 1.0' in text
            assert 'hostagent_scrape_collector_success{collector="gpu"} 1.0' in text
            assert "DCGM_FI_DEV_GPU_TEMP{" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                                      timeout=10).read().decode()
            assert c.labels()["labels"]["nvidia.com/gpu.count"] == "8"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics_or_why_not(c) -> str:
    try:
        return c.metrics()
    except UnavailableError as e:
        return f"unavailable: {e}"


def _notified(agent_env_name: str):
    return NotifySocket(agent_env_name), {"NOTIFY_SOCKET": agent_env_name}


def test_sighup_during_start_up_is_applied_once_started(root):
    """The start reconcile can take minutes (a MIG apply): a reload asked for meanwhile is
    neither lost nor fatal, and several make one."""
    from hostagent.lock import node_lock
    notify, env = _notified("@hostagent-test-hup-%d" % os.getpid())
    agent = AgentProcess(root, {"mig": {"config": "all-disabled"}, "daemon": {"resync_interval": 0}}, env=env)
    try:
        # The MIG reconcile takes the node lock: held here, the start waits for it.
        with node_lock(agent.host, "test: a long start-up"):
            agent.start(wait=False)
            notify.wait_for("STATUS", "starting: reading the inventory")
            agent.write_config({"mig": {"config": "all-disabled"}, "api": {"max_body_bytes": 1024},
                                "daemon": {"resync_interval": 0}})
            agent.signal(signal.SIGHUP)
            agent.signal(signal.SIGHUP)
        notify.wait_for("READY", "1")
        notify.wait_for("RELOADING", "1")
        ready = notify.wait_for("READY", "1")
        assert "last reload failed" not in ready["STATUS"]
        body = b'{"id": "x", "devices": [{"device": "1"}], "labels": {"a": "' + b"b" * 1100 + b'"}}'
        with agent.client() as c:
            assert c.transport.handle_request(Request("POST", "/v1/allocations", body)).status == 413
        assert agent.stop() == 0
        log = agent.log()
        assert "SIGHUP received during start-up" in log
        assert log.count("configuration reloaded") == 1, log
        assert "Traceback" not in log and "never retrieved" not in log, log
    finally:
        notify.close()
        agent.cleanup()


def test_sighup_before_the_event_loop_exists_is_remembered(root):
    """A HUP while the daemon is still starting (held, stopped, right after it read its
    configuration) neither kills it nor is lost: it reloads the configuration once started."""
    notify, env = _notified("@hostagent-test-early-%d" % os.getpid())
    config = {"daemon": {"resync_interval": 0}, "metrics": {"port": None}}
    agent = AgentProcess(root, config, env={**env, "HOSTAGENT_FAULT": "start:settings_read=stop"})
    try:
        agent.start(wait=False)
        until(lambda: _state(agent.proc.pid) == "T" or agent.proc.poll() is not None, 20, agent.log, interval=0.02)
        assert agent.proc.poll() is None, agent.log()
        agent.signal(signal.SIGHUP)
        agent.write_config({**config, "api": {"max_body_bytes": 1024}})     # what the reload reads
        os.kill(agent.proc.pid, signal.SIGCONT)
        notify.wait_for("READY", "1")
        notify.wait_for("RELOADING", "1")
        notify.wait_for("READY", "1")
        body = b'{"id": "x", "devices": [{"device": "1"}], "labels": {"a": "' + b"b" * 1100 + b'"}}'
        with agent.client() as c:
            assert c.transport.handle_request(Request("POST", "/v1/allocations", body)).status == 413
        assert agent.stop() == 0
    finally:
        notify.close()
        agent.cleanup()


def _state(pid: int) -> str:
    """The process's state letter (T: stopped) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@GPU_CHANGES                    # a MIG layout applied
def test_status_follows_allocations_releases_and_mig_changes(root):
    notify, env = _notified("@hostagent-test-status-%d" % os.getpid())
    agent = AgentProcess(root, env=env)
    try:
        agent.start()
        assert notify.wait_for("READY", "1")["STATUS"].startswith("serving 8 GPU(s), 0 MIG device(s), 0 allocation(s)")
        notify.messages.clear()                          # the start-up's
        with agent.client() as c:
            c.allocate("a", ["0"])
            notify.wait_for_status("serving 8 GPU(s), 0 MIG device(s), 1 allocation(s)")
            c.release("a")
            notify.wait_for_status("serving 8 GPU(s), 0 MIG device(s), 0 allocation(s)")
            c.request("POST", "/v1/mig/apply", {"config": "all-1g.5gb"})
            notify.wait_for_status("serving 8 GPU(s), 56 MIG device(s)")   # after the mode change
            c.refresh()                                  # nothing changed: nothing sent
        agent.stop()
        assert [m["STATUS"] for m in notify.pending()] == ["stopping"], notify.messages
    finally:
        notify.close()
        agent.cleanup()


def test_command_line_log_level_wins_over_a_reload(root):
    notify, env = _notified("@hostagent-test-level-%d" % os.getpid())
    agent = AgentProcess(root, {"daemon": {"resync_interval": 0, "log_level": "info"}}, env=env)
    agent.args = ["--log-level", "warning"]
    try:
        agent.start()
        # The reload asks for info; a key that needs a restart makes it say so, a warning.
        agent.write_config({"daemon": {"resync_interval": 0, "log_level": "info"}, "api": {"socket_mode": "0600"}})
        agent.signal(signal.SIGHUP)
        notify.wait_for("RELOADING", "1")
        notify.wait_for("READY", "1")
        with agent.client() as c:
            c.allocate("quiet", ["0"])
            # After the reload, a warning is still logged (a driver install holding GPU work).
            c.request("POST", "/v1/driver/maintenance", {"pid": os.getpid(), "operation": "a test's install"})
            c.request("DELETE", "/v1/driver/maintenance")
        agent.stop()
        log = agent.log()
        assert "api.socket_mode changed: takes effect at the next restart" in log      # warnings still out
        assert "driver maintenance: a test's install" in log
        assert "allocation quiet created" not in log and "listening on" not in log
        assert "configuration reloaded from" not in log
    finally:
        notify.close()
        agent.cleanup()
