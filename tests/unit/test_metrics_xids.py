"""XID names for the err_msg label: every code of the catalogue, and past it."""

from hostagent.metrics.render import _with_xid
from hostagent.metrics.xids import NAMES, UNKNOWN, xid_name


def test_names_by_code_and_unknown_past_the_catalogue():
    assert xid_name(0) == "No Error" and xid_name(79) == "GPU has fallen off the bus"
    assert xid_name(31) == "GPU memory page fault" and xid_name(13) == "Graphics Engine Exception"
    assert all(xid_name(code) for code in range(len(NAMES)))
    assert xid_name(len(NAMES)) == xid_name(999) == xid_name(-1) == UNKNOWN


def test_labels_are_appended_and_escaped():
    assert _with_xid('{gpu="0"}', 45) == ('{gpu="0",err_code="45",err_msg="Preemptive cleanup, due to '
                                          'previous errors -- Most likely to see when running multiple cuda"}')
    assert _with_xid("{}", 1000) == '{err_code="1000",err_msg="Unknown Error"}'
