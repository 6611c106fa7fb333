"""A daemon whose work is stuck (a call on its worker that never returns) still answers
reads from its event loop; its liveness probe says it is stuck, so it gets restarted."""

import subprocess
import sys
import threading

from hostagent.errors import HostagentError

from tests.waiting import until

from .agentd import FAST, AgentProcess, make_root


def check(agent) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hostagent.daemon.main", "--check", "--simulate", str(agent.root),
                           "--config", str(agent.config)], capture_output=True, text=True, timeout=30)


def test_check_fails_when_the_work_is_stuck_though_reads_are_answered():
    config = {**FAST, "daemon": {**FAST["daemon"], "work_timeout": 1}}
    agent = AgentProcess(make_root("dgx-a100"), config, env={"HOSTAGENT_FAULT": "allocate:after_spec=hang"}).start()
    try:
        ok = check(agent)
        assert ok.returncode == 0 and "its work moves" in ok.stdout, ok.stderr

        def allocate():
            try:
                with agent.client(timeout=30) as c:
                    c.allocate("stuck", ["0"])
            except HostagentError:
                pass
        threading.Thread(target=allocate, daemon=True).start()
        stuck = until(lambda: (r := check(agent)).returncode != 0 and r, 20, "--check still passes", interval=0.2)
        assert stuck.returncode == 1
        assert "answers, but the agent's work is stuck: the worker has run Allocator._commit_new" in stuck.stderr
        with agent.client(timeout=5) as c:
            assert c.node()["gpus"] == 8            # the loop answers all the same
    finally:
        agent.kill()
        agent.cleanup()
