"""Values checked with a pattern are checked whole: a trailing newline (which Python's ``$``
lets through) or a non-ASCII digit (which ``\\d`` and ``str.isdigit`` let through) is refused,
in the agent's own patterns and in its JSON Schemas' ones."""

import pytest

from hostagent.api.http import HttpError, Limits, parse_head
from hostagent.api.schema import validate_body
from hostagent.daemon import allocations
from hostagent.driver.plan import check_version
from hostagent.errors import ConfigError, UsageError
from hostagent.schemas import strict_pattern
from hostagent.sharing.config import parse


def test_driver_versions_are_whole():
    assert check_version("550.127.05") == "550.127.05"
    for bad in ("550.127.05\n", "550.127.05 ", "\n550.127.05", "550.1２7.05"):
        with pytest.raises(UsageError):
            check_version(bad)


def test_allocation_ids_and_replicas_are_whole():
    body = {"id": "pod-a\n", "devices": [{"device": "0"}]}
    with pytest.raises(UsageError):
        validate_body("createAllocation", body)          # the API's schema
    with pytest.raises(UsageError):
        allocations.normalize(body)                      # and the rule behind it
    assert allocations.replica_of("GPU-1::3") == ("GPU-1", 3)
    assert allocations.replica_of("GPU-1::3\n") is None


def test_schema_patterns_end_at_the_end():
    assert strict_pattern("^[0-9]+$").search("42") and not strict_pattern("^[0-9]+$").search("42\n")
    assert strict_pattern(r"^a\$[$]$").search("a$$")           # escaped and bracketed $ stay literal
    doc = {"version": "v1", "sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2, "pinnedMemoryLimit": "8Gi\n"}]}}}
    with pytest.raises(ConfigError):
        parse(doc, "test")


def test_http_tokens_and_lengths_are_whole_and_ascii():
    for head in (b"GET /v1/node HTTP/1.1\r\nContent-Length: \xb2",        # latin-1 superscript two
                 b"GET /v1/node HTTP/1.1\r\nContent-Length: 5\n"):
        with pytest.raises(HttpError):
            parse_head(head, Limits())
