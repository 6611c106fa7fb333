"""Recovery after a crash retries what is transient (a GPU or instance still held by a
client about to let go) and says clearly when it cannot finish, keeping the journal."""

import pynvml as N
import pytest

from hostagent.errors import NvmlError
from hostagent.mig import service
from hostagent.mig.journal import ROLLING_BACK, Journal
from hostagent.mig.recovery import RecoveryError, recover
from hostagent.mig.runner import InUse, transient
from tests.rootneeds import GPU_CHANGES

from .test_mig_faults import AMPERE, HOPPER, consistent, crash_at, setup, snapshot

pytestmark = GPU_CHANGES


def crashed(make_node, profile, spec, step):
    host, old, new, steps = setup(make_node, profile, spec)
    assert crash_at(host, spec, "kill-before", step)
    assert Journal.load(host) is not None
    return host, old


@pytest.mark.parametrize("profile, spec, step", [("hgx-h100", HOPPER, 3), ("hgx-h100", HOPPER, 9),
                                                 ("dgx-a100", AMPERE, 1)])
def test_in_use_during_recovery_is_waited_for(make_node, profile, spec, step):
    host, old = crashed(make_node, profile, spec, step)
    # The first two mutating calls of the rollback find the GPU busy, as a just-killed
    # process not yet reaped would leave it; the third attempt goes through.
    for _ in range(2):
        N.nvmlLib.inject("error", after=0, code=N.NVML_ERROR_IN_USE)
    said = []
    note = recover(host, progress=lambda gpu, message: said.append(message), retry_seconds=20)
    assert note.startswith("rolled back the interrupted apply")
    assert snapshot(host) == old
    assert sum("retrying in" in m for m in said) == 2
    assert N.nvmlLib.faults == []
    consistent(host)


def test_recovery_that_stays_blocked_says_so_and_keeps_the_journal(make_node):
    host, old = crashed(make_node, "hgx-h100", HOPPER, 3)
    for _ in range(1000):
        N.nvmlLib.inject("error", after=0, code=N.NVML_ERROR_IN_USE)
    with pytest.raises(RecoveryError) as e:
        recover(host, retry_seconds=0.5)
    message = e.value.message
    assert "rolling back the interrupted apply of 'new'" in message
    assert "In use by another client" in message and "attempts over 0.5 s" in message
    assert "the journal is kept" in message
    assert Journal.load(host).record.status == ROLLING_BACK
    N.nvmlLib.faults[:] = []
    assert "rolled back" in service.recover_pending(host)       # the next command finishes it
    assert snapshot(host) == old
    consistent(host)


def test_a_refusal_that_repeats_is_not_retried(make_node):
    host, old = crashed(make_node, "hgx-h100", HOPPER, 3)
    N.nvmlLib.inject("error", after=0, code=N.NVML_ERROR_UNKNOWN)
    with pytest.raises(RecoveryError, match="Unknown Error") as e:
        recover(host, retry_seconds=30)
    assert "attempts" not in e.value.message
    assert service.recover_pending(host)
    assert snapshot(host) == old


def test_what_counts_as_transient():
    assert transient(InUse("x"))
    assert transient(NvmlError("x", nvml_code=N.NVML_ERROR_IN_USE))
    assert not transient(NvmlError("x", nvml_code=N.NVML_ERROR_INSUFFICIENT_RESOURCES))
    assert not transient(ValueError("x"))
