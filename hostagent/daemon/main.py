"""The daemon's lifecycle: start-up reconcile, serve, reload on SIGHUP, stop on SIGTERM.

``hostagentd`` and ``hostagent serve`` both land in ``run``. Under systemd (Type=notify) it
says READY=1 once the socket serves, keeps STATUS current, pings the watchdog from the
event loop (a wedged loop stops the pings and systemd restarts the service), and says
RELOADING=1/STOPPING=1 around reloads and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys

from ..errors import ConfigError, HostagentError
from ..hostroot import HostRoot

__all__ = ["main", "build_parser", "run", "Daemon", "hold_hangups"]

log = logging.getLogger("hostagent.daemon")

# A SIGHUP that arrived before the daemon could reload (see hold_hangups).
_early_hangup = False


def _remember_hangup(signum, frame) -> None:
    global _early_hangup
    _early_hangup = True


def hold_hangups() -> None:
    """From here on a SIGHUP is remembered, not fatal (its default action ends the process),
    and the daemon reloads once it has started. Called first thing (``hostagentd``'s
    ``main``, and ``run``, where ``hostagent serve`` lands too; a second call changes
    nothing): a ``systemctl reload`` or ``kill -HUP`` may come at any time during a start-up
    that can take minutes (a MIG apply)."""
    signal.signal(signal.SIGHUP, _remember_hangup)


def _take_early_hangup() -> bool:
    global _early_hangup
    taken, _early_hangup = _early_hangup, False
    return taken


def _server_options(api, gid):
    from ..api.http import Limits
    from ..api.server import ServerOptions
    return ServerOptions(
        limits=Limits(max_header_bytes=api.max_header_bytes, max_body_bytes=api.max_body_bytes),
        header_timeout=api.header_timeout, body_timeout=api.body_timeout,
        idle_timeout=api.idle_timeout, write_timeout=api.write_timeout,
        max_connections=api.max_connections, max_connections_per_user=api.max_connections_per_user,
        root_reserved=api.root_reserved_connections, agent_gid=gid)


class Daemon:
    def __init__(self, host: HostRoot, settings, config_path=None, log_level: str | None = None):
        from .notify import Notifier
        self.host = host
        self.settings = settings
        self.config_path = config_path
        self.log_level = log_level        # from the command line: wins over daemon.log_level
        self.notifier = Notifier()
        self.agent = None
        self.features = None
        self.server = None
        self.socket_path = host.host(settings.api.socket)
        self._stop = None
        self._tasks: set[asyncio.Task] = set()
        self._serving = False             # start-up done: reloads run, STATUS says "serving"
        self._reload_wanted = False       # a SIGHUP not yet acted on
        self._reloader: asyncio.Task | None = None
        self._reload_error: str | None = None   # why the last reload failed, until one succeeds
        self._status_sent: str | None = None

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def status_text(self) -> str:
        node = self.agent.snapshot.node
        if self.agent.driver.maintenance is not None:
            text = f"maintenance: {self.agent.driver.why}"
        elif not self.agent.driver.ready:
            text = f"degraded, retrying: {self.agent.driver.why}"
        elif node.get("inventory", {}).get("state") == "error":
            text = f"serving; inventory unreadable: {node['inventory']['message']}"
        else:
            text = (f"serving {node.get('gpus', 0)} GPU(s), {node.get('mig_devices', 0)} MIG device(s), "
                    f"{len(self.agent.allocations)} allocation(s) on {self.socket_path}")
        if self._reload_error:
            text += f"; last reload failed: {self._reload_error}"
        return text

    def _status_changed(self) -> None:
        """After every publish: STATUS= when its text changed (a string compared otherwise)."""
        if not self._serving or not self.notifier.enabled or self._reloading:
            return
        text = self.status_text()
        if text != self._status_sent:
            self._status_sent = text
            self.notifier.status(text)

    @property
    def _reloading(self) -> bool:
        return self._reloader is not None and not self._reloader.done()

    def _ready(self) -> None:
        self._status_sent = self.status_text()
        self.notifier.ready(self._status_sent)

    async def run(self) -> int:
        from ..api.routes import App
        from ..api.server import ApiServer
        from .agent import Agent
        from .features import Features
        from pathlib import Path

        from ..client import admin_socket
        from .listen import bind_socket
        from .notify import watchdog_interval
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # Made before the signal handlers, which tell it of a stop (making it only reads the
        # revision file).
        self.agent = Agent(self.host, self.settings)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop)
        # Until start-up is done a SIGHUP is only noted (reload needs the agent, the features
        # and the server); one that came before the loop existed was noted by hold_hangups.
        loop.add_signal_handler(signal.SIGHUP, self._hangup)
        self._reload_wanted = _take_early_hangup()

        self.notifier.status("starting: reading the inventory")
        self.agent.publish_listeners.append(self._status_changed)
        await self.agent.start()
        if self._stop.is_set():
            return self._stop_during_start()
        self.notifier.status("starting: GPU sharing")
        await self.agent.sharing.start()
        self.notifier.status("starting: health monitor and metrics")
        self.features = Features(self.agent, self._spawn)
        self.agent.features = self.features
        self.features.make(self.settings)
        self.agent.inventory_listeners.append(self.features.inventory_changed)
        await self.features.start()
        if self._stop.is_set():
            await self.features.stop(exiting=True)
            return self._stop_during_start()
        api = self.settings.api
        sock, gid = bind_socket(self.socket_path, api.group, api.mode, host=self.host)
        admin_path = Path(admin_socket(self.socket_path))
        admin, _ = bind_socket(admin_path, None, 0o600)
        inodes = {p: os.stat(p).st_ino for p in (self.socket_path, admin_path)}
        self.server = ApiServer(App(self.agent), _server_options(api, gid))
        await self.server.start(sock, admin)
        log.info("listening on %s", self.socket_path, extra={"fields": {"socket": str(self.socket_path)}})
        self._serving = True
        # What start-up made lives as long as the daemon: out of the collector's sight, a
        # full collection no longer walks it (a pause in some request's answer otherwise).
        gc.collect()
        gc.freeze()
        self._ready()
        if self._reload_wanted:
            log.info("reloading the configuration: SIGHUP received during start-up")
            self._start_reload()

        interval = watchdog_interval()
        if interval:
            self._spawn(self._watchdog(interval))
        self._spawn(self._resync())
        self._spawn(self.agent.driver.watch())
        self._spawn(self.features.supervise())
        self._spawn(self.agent.sharing.supervise())
        self._spawn(self.agent.allocator.supervise())
        await self._stop.wait()

        log.info("stopping")
        self._serving = False
        self.notifier.stopping()
        for task in list(self._tasks):
            task.cancel()
        # Alongside the server's grace period, and without waiting out the monitor's NVML
        # wait (up to health.wait_timeout_ms): the process is about to exit.
        features = asyncio.ensure_future(self.features.stop(exiting=True))
        await self.server.stop(self.settings.daemon.shutdown_grace)
        await features
        for path, inode in inodes.items():
            try:
                # Only our own socket: a newer daemon may have replaced it already.
                if os.stat(path).st_ino == inode:
                    os.unlink(path)
            except OSError:
                pass
        sock.close()
        admin.close()
        self.agent.driver.markers.not_ready()     # as the GPU operator's validator at its stop
        self.agent.close()
        return 0

    def _request_stop(self) -> None:
        """SIGTERM or SIGINT: stop; a MIG apply under way (the start-up layout or an API
        request) is interrupted before its next GPU and rolled back, not run to the end."""
        self._stop.set()
        self.agent.stop_requested.set()

    def _stop_during_start(self) -> int:
        """Stopped before serving: the step under way finished (an interrupted MIG apply
        rolled back), no socket was bound."""
        log.info("stopping: asked to stop during start-up")
        self.notifier.stopping()
        self.agent.driver.markers.not_ready()
        self.agent.close()
        return 0

    async def _watchdog(self, interval: float) -> None:
        """systemd's watchdog, kept only while the agent's work moves: stuck, systemd
        restarts it (WatchdogSec)."""
        said = None
        while True:
            why = self.agent.stuck()
            if why is None:
                self.notifier.watchdog()
            elif why != said:
                log.error("not telling systemd's watchdog the agent lives: %s", why)
            said = why
            await asyncio.sleep(interval)

    async def _resync(self) -> None:
        """Re-read the inventory every ``resync_interval``; sooner while it is unreadable."""
        backoff = 2.0
        while True:
            interval = self.settings.daemon.resync_interval
            if self.agent.inventory_error is not None:
                delay = backoff if not interval else min(backoff, interval)
                backoff = min(backoff * 2, 60.0)
            elif interval:
                delay, backoff = interval, 2.0
            else:
                delay = 3600.0          # nothing to do; look again for a changed setting
            await asyncio.sleep(delay)
            if self.agent.inventory_error is not None or self.settings.daemon.resync_interval:
                await self.agent.refresh("resync")

    def _hangup(self) -> None:
        """SIGHUP: reload now, or once started, or once the reload under way is done (one
        reload at a time; several signals meanwhile make one more)."""
        self._reload_wanted = True
        if self._serving:
            self._start_reload()

    def _start_reload(self) -> None:
        if self._reloader is None or self._reloader.done():
            self._reloader = asyncio.get_running_loop().create_task(self._reloads())
            self._tasks.add(self._reloader)
            self._reloader.add_done_callback(self._tasks.discard)

    async def _reloads(self) -> None:
        while self._reload_wanted and self._serving:
            self._reload_wanted = False
            try:
                await self.reload()
            except Exception as e:   # a bug: say so, keep serving with what was applied
                log.exception("reload failed")
                self._reload_error = f"internal error: {e}"
                self._ready()

    async def reload(self) -> None:
        """Validate the new configuration; keep the old one if it is bad."""
        from .logs import set_level
        from .settings import load_settings
        self.notifier.reloading()
        try:
            new = load_settings(self.host, self.config_path)
        except ConfigError as e:
            log.error("configuration not reloaded, the previous one stays in force: %s", e.message,
                      extra={"fields": {"config": self.config_path or str(self.host.config_file)}})
            self._reload_error = e.message
            self._ready()
            return
        self._reload_error = None
        for key in self.settings.restart_needed(new):
            log.warning("%s changed: takes effect at the next restart", key)
        api = new.api
        old_gid = self.server.options.agent_gid
        self.server.options = _server_options(api, old_gid)
        self.agent.events.resize(api.watch_buffer)
        set_level(self.log_level or new.daemon.log_level)
        old, self.settings = self.settings, new
        self.agent.settings = new
        self.agent.work.budget = new.daemon.work_timeout
        log.info("configuration reloaded: %s", in_force(self.host, new),
                 extra={"fields": {"config": str(self.host.config_file)}})
        self.agent.driver.reconfigure(new.sections)
        await self.agent.driver.verify("reload")
        if new.mig != old.mig and new.mig.config is not None:
            async with self.agent.mutex:
                await self.agent.mig.reconcile(new.mig, "reload")
        await self.features.reload(old, new)
        await self.agent.refresh("reload")
        await self.agent.sharing.reload()
        self._ready()


def in_force(host: HostRoot, settings) -> str:
    """Which configuration is in force, for the log: the file, or the defaults and the file
    that would be read (on a simulated node, the node's etc/hostagent/config.yaml)."""
    if settings.source:
        return f"from {settings.source}"
    return f"the defaults: there is no {host.config_file}"


def with_config(host: HostRoot, config_path) -> HostRoot:
    """``host`` whose ``config_file`` is ``config_path`` when one is given (``--config``):
    every hint that names the configuration then names the file in force."""
    import dataclasses
    from pathlib import Path
    return dataclasses.replace(host, config=Path(config_path).absolute()) if config_path else host


def missing_config(config_path) -> str | None:
    """Why a ``--config`` file cannot be the configuration: it does not exist. (Without
    ``--config`` a missing file means every default.)"""
    if config_path is None or os.path.lexists(config_path):
        return None
    return (f"--config {config_path}: no such file (give an existing file, or leave --config out for "
            "the default)")


def run(host: HostRoot, config_path=None, log_level: str | None = None) -> int:
    hold_hangups()
    from .listen import instance_lock
    from .logs import setup_logging
    from .settings import load_settings
    setup_logging(log_level or "info")
    host = with_config(host, config_path)
    try:
        settings = load_settings(host, config_path)
    except ConfigError as e:
        log.error("cannot start: %s", e.message)
        return 1
    log.info("configuration: %s", in_force(host, settings), extra={"fields": {"config": str(host.config_file)}})
    from .. import faults
    faults.point("start:settings_read")
    from .logs import set_level
    set_level(log_level or settings.daemon.log_level)
    try:
        with instance_lock(host):
            return asyncio.run(Daemon(host, settings, config_path, log_level).run())
    except HostagentError as e:
        log.error("cannot start: %s", e.message)
        return 1


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..cli.parser import Parser, add_root_options
    from .args import add_arguments
    parser = Parser(prog="hostagentd", description="The hostagent daemon.")
    parser.add_argument("--version", action="version", version=f"hostagentd {__version__}")
    add_arguments(parser)
    add_root_options(parser)
    parser.add_argument("--check", action="store_true",
                        help="do not start: ask the running daemon whether its work moves (GET /v1/live on "
                             "api.socket) and exit 0 if it does, 1 if it does not answer, its work is stuck "
                             "(a liveness probe) or its allocations checkpoint was found damaged")
    return parser


def simulator():
    """The simulator's platform, for a node named by --simulate (or HOSTAGENT_SIMULATE): the
    one place the daemon reaches into the simulator (imported only then)."""
    from ..sim.platform import SIMULATOR
    return SIMULATOR


SERVICE = "hostagent.service"


def service_node(run=None) -> str | None:
    """The simulated node systemd's hostagent.service runs on (its ``HOSTAGENT_SIMULATE``,
    set by a drop-in as docs/install.md shows) while the service is active; None otherwise,
    or without systemctl."""
    import shlex
    import subprocess
    try:
        done = (run or subprocess.run)(["systemctl", "show", SERVICE, "--property=ActiveState",
                                        "--property=Environment"],
                                       capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    props = dict(line.partition("=")[::2] for line in done.stdout.splitlines())
    if done.returncode != 0 or props.get("ActiveState") not in ("active", "reloading", "activating"):
        return None
    env = dict(word.partition("=")[::2] for word in shlex.split(props.get("Environment", "")))
    return env.get("HOSTAGENT_SIMULATE") or None


def _ask_live(host: HostRoot, config_path):
    from ..client import Client
    from .settings import load_settings
    socket_path = host.host(load_settings(host, config_path).api.socket)
    with Client(socket_path=socket_path, timeout=5.0) as client:
        return socket_path, client.live(), client.get("/v1/checkpoint/unreadable")


def check(host: HostRoot, config_path=None, *, find_service_node=service_node) -> int:
    """``hostagentd --check``: one line saying whether the node's daemon answers and its
    work moves. Asked on the host without --simulate while systemd's service runs on a
    simulated node, it asks that node's daemon, and says so."""
    from ..client import DaemonNotRunning
    which = ""
    try:
        try:
            socket_path, live, damage = _ask_live(host, config_path)
        except DaemonNotRunning:
            node = None if host.simulated or host.mounted or config_path else find_service_node()
            if not node:
                raise
            host = HostRoot.from_env(node, simulator=simulator)
            which = f" (the simulated node {node} of {SERVICE}; next time: hostagentd --check --simulate {node})"
            socket_path, live, damage = _ask_live(host, None)
    except HostagentError as e:
        print(f"hostagentd: {'answers, but' if e.code == 'stuck' else 'not answering:'} {e.message}{which}",
              file=sys.stderr)
        return 1
    if damage.get("state") != "ok":
        held = damage.get("held_devices")
        print(f"hostagentd: answers, but its allocations checkpoint is damaged: {len(damage.get('unreadable', []))} "
              f"unreadable record(s) set aside, {'every device' if held is None else ', '.join(held) or 'no device'} "
              "held back from new allocations (see GET /v1/checkpoint/unreadable; when they are settled, "
              "hostagent allocations dismiss-unreadable)", file=sys.stderr)
        return 1
    print(f"hostagentd {live.get('version', '?')} (pid {live.get('pid', '?')}) answers on {socket_path}, "
          f"its work moves{which}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``hostagentd``: the daemon alone, for the systemd unit."""
    hold_hangups()          # before parsing too: the unit's reload may come that early
    args = build_parser().parse_args(argv)
    try:
        host = HostRoot.from_env(args.simulate, args.host_root, args.driver_root, simulator=simulator)
    except HostagentError as e:
        print(f"hostagentd: error: {e.message}", file=sys.stderr)
        return 2
    try:
        host.platform.require_node(host)      # nothing is written into a folder that is not a node
    except HostagentError as e:
        print(f"hostagentd: error: {e.message}", file=sys.stderr)
        return 1
    if missing_config(args.config):
        print(f"hostagentd: error: {missing_config(args.config)}", file=sys.stderr)
        return 2
    if args.check:
        return check(host, args.config)
    try:
        return run(host, args.config, args.log_level)
    except OSError as e:                  # its run folder, socket or state
        print(f"hostagentd: error: {start_failure(e)}", file=sys.stderr)
        return 1


def start_failure(e: OSError) -> str:
    """One line for a folder or file the daemon could not make at start, with the fix."""
    import errno
    from ..cli.errors import os_error
    if e.errno == errno.EROFS:
        fix = ("the daemon may not write there: under systemd, a drop-in gives it the folder (for a "
               "simulated node, ReadWritePaths= with its folder: see docs/install.md); in a container, "
               "mount it read-write")
    else:
        fix = "the daemon runs as root: systemctl start hostagent, or sudo hostagentd"
    return f"cannot start: {os_error(e)}; {fix}"


if __name__ == "__main__":
    sys.exit(main())
