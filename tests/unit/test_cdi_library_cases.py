"""``cdi validate`` agrees with the CDI library on the library's own test cases
(data/cdi_library_cases.yaml), except where a documented, deliberate difference says why;
and whatever a spec file holds, validation gives a list of problems, never an exception."""

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from hostagent.cdi.validate import read_spec, validate_spec
from hostagent.errors import ConfigError

CASES = yaml.safe_load((Path(__file__).parent / "data" / "cdi_library_cases.yaml").read_text())
DOCS = (Path(__file__).parents[2] / "docs" / "cdi.md").read_text()


def document(case) -> str:
    if "spec" in case:
        return case["spec"]
    return json.dumps({"cdiVersion": case.get("version", "1.1.0"), "kind": "vendor.com/device",
                       "devices": [{"name": "dev1", "containerEdits": case["edits"]}]})


def verdict(tmp_path, text: str) -> tuple[bool, list[str]]:
    path = tmp_path / ("spec.json" if text.lstrip().startswith("{") else "spec.yaml")
    path.write_text(text)
    try:
        doc, problems = read_spec(path)
    except ConfigError as e:
        return False, [e.message]
    problems = problems + validate_spec(doc)
    return not problems, problems


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_validate_agrees_with_the_cdi_library(tmp_path, case):
    valid, problems = verdict(tmp_path, document(case))
    if "differs" in case:
        assert valid != case["valid"], "a documented difference that is no longer one"
        assert case["differs"].split(",")[0] in DOCS, "each difference is documented in docs/cdi.md"
    else:
        assert valid == case["valid"], problems


def test_the_table_has_both_verdicts_and_few_differences():
    assert sum(c["valid"] for c in CASES) >= 20 and sum(not c["valid"] for c in CASES) >= 40
    assert sum("differs" in c for c in CASES) <= 4


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=15)
KEYS = ["cdiVersion", "kind", "devices", "containerEdits", "annotations", "name", "env", "deviceNodes",
        "mounts", "hooks", "intelRdt", "additionalGids", "netDevices", "path", "hostPath", "type", "major",
        "permissions", "uid", "fileMode", "containerPath", "options", "hookName", "args", "timeout",
        "closID", "schemata", "enableMonitoring", "hostInterfaceName"]


def mutate(doc, where, value):
    """``doc`` with the value at a path of known keys replaced."""
    if not where:
        return value
    key = where[0]
    if isinstance(doc, dict):
        return {**doc, key: mutate(doc.get(key, {}), where[1:], value)}
    if isinstance(doc, list) and doc:
        return [mutate(doc[0], where, value)] + doc[1:]
    return {key: mutate({}, where[1:], value)}


VALID = json.loads(document(next(c for c in CASES if c["name"] == "the schema's example spec")))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), JSON)
def test_no_document_makes_validation_raise(where, value):
    for doc in (mutate(VALID, where, value), value):
        problems = validate_spec(doc)
        assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
