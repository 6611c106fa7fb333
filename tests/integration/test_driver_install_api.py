"""``POST /v1/driver/install`` on a simulated Debian 12 node: the agent runs ``driver
install`` in a process of its own, which outlives the agent (a restart during the install
loses nothing), reports its step and outcome in ``GET /v1/driver/install``, never installs
the version the verified driver has, and resumes an interrupted install from its journal."""

from __future__ import annotations

import json
import os
import signal

import pytest

from hostagent.errors import ConflictError, UsageError
from tests.waiting import until

from .agentd import make_root, running_agent

A, B, C = "550.90.07", "550.127.05", "570.86.15"      # A: the node's driver at creation
AGENT = {"daemon": {"resync_interval": 0}, "driver": {"interval": 0}}


def ended(agent, timeout: float = 60) -> dict:
    with agent.client() as c:
        return until(lambda: (lambda v: v if v["state"] not in ("starting", "running") else None)(c.driver_install()),
                     timeout, lambda: f"the install did not end:\n{agent.log()[-3000:]}", interval=0.1)


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def verified(agent) -> str | None:
    with agent.client() as c:
        driver = c.driver()
    return driver["version"] if driver["state"] == "ready" else None


def test_an_install_through_the_agent_reports_its_outcome_and_is_never_run_twice():
    with running_agent(make_root("a30x4"), AGENT) as agent:
        with agent.client() as c:
            assert c.driver_install()["state"] == "none"
            same = c.install_driver(A)                      # the verified driver: nothing to do
            assert same["started"] is False and same["state"] == "none"
            first = c.install_driver(B, force=True)
            assert first["started"] is True and first["version"] == B
            again = c.install_driver(B)                     # while it runs: the same install
            assert again["started"] is False or again["state"] == "succeeded"
        done = ended(agent)
        assert (done["state"], done["version"], done["error"]) == ("succeeded", B, None)
        assert done["outcome"]["ok"] and done["outcome"]["previous"] == A and done["journal"] is None
        assert done["progress"].startswith("resume:") and done["log"].endswith("driver/install.log")
        until(lambda: verified(agent) == B, 30, "the agent verifying the new driver")
        with agent.client() as c:
            assert c.install_driver(B)["started"] is False                         # installed: not again
        assert agent.log().count(f"driver install of {B} started") == 1
        assert f"driver maintenance: driver install {B}" in agent.log()


def test_a_version_no_repository_offers_fails_and_changes_nothing():
    with running_agent(make_root("a30x4"), AGENT) as agent:
        with agent.client() as c:
            assert c.install_driver("999.1.1")["started"] is True
            with pytest.raises(UsageError):
                c.install_driver("latest")
        done = ended(agent)
        assert done["state"] == "failed" and done["outcome"] is None
        assert done["error"].startswith("no repository offers nvidia-driver 999.1.1 (offered: ")
        assert verified(agent) == A


def test_the_install_outlives_a_restart_of_the_agent_and_an_interrupted_one_resumes():
    """The installer stops itself before its verify step (a fault point); the agent is
    killed and started again meanwhile: the new agent sees the same install run, which then
    ends. A second install killed at the same point is interrupted, and asking for it again
    resumes its journal (the steps done are not run again)."""
    root = make_root("a30x4")
    env = {"HOSTAGENT_FAULT": "driver:before_verify=stop"}
    with running_agent(root, AGENT, env) as agent:
        with agent.client() as c:
            c.install_driver(B, force=True)
            held = until(lambda: (lambda v: v if v["progress"] and v["progress"].startswith("verify:") else None)(
                c.driver_install()), 30, "the installer at its verify step", interval=0.1)
        pid = held["process"]["pid"]
        until(lambda: stopped(pid), 10, "a stopped installer")
        agent.kill()
        agent.start()
        with agent.client() as c:
            assert c.driver_install()["state"] == "running" and c.driver_install()["process"]["pid"] == pid
            with pytest.raises(ConflictError):
                c.install_driver(C)                         # another version waits for this one
        os.kill(pid, signal.SIGCONT)
        assert ended(agent)["state"] == "succeeded"
        until(lambda: verified(agent) == B, 30, "the agent verifying the new driver")

        with agent.client() as c:
            c.install_driver(C, force=True)
            held = until(lambda: (lambda v: v if v["progress"] and v["progress"].startswith("verify:") else None)(
                c.driver_install()), 30, "the second installer at its verify step", interval=0.1)
        until(lambda: stopped(held["process"]["pid"]), 10, "the second installer stopped")   # its journal says verify
        os.kill(held["process"]["pid"], signal.SIGKILL)
        interrupted = ended(agent)
        assert interrupted["state"] == "interrupted" and "at step verify" in interrupted["journal"]
        journal = json.loads((root / "var/lib/hostagent/driver/journal.json").read_text())
        assert "install" in journal["done"]
        agent.env = {}                                      # no more stops
        agent.stop()
        agent.start()
        with agent.client() as c:
            assert c.install_driver(C, force=True)["started"] is True
        done = ended(agent)
        assert done["state"] == "succeeded" and done["outcome"]["version"] == C
        # the agent is held again, then only what was left runs
        assert [s["step"] for s in done["outcome"]["steps"]] == ["maintenance", "verify", "resume"]
        until(lambda: verified(agent) == C, 30, "the agent verifying the resumed driver")
