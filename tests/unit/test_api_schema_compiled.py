"""Request bodies checked by compiled code first: it accepts every valid body and only what
jsonschema accepts (the judge, on the document's own 2020-12 schema), a body it refuses
gets jsonschema's verdict and words, and jsonschema is not even loaded while bodies are
valid."""

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis_jsonschema import from_schema

from hostagent.api import schema
from hostagent.errors import UsageError

OPERATIONS = [op["operationId"] for item in schema.document()["paths"].values() for op in item.values()
              if isinstance(op, dict) and "requestBody" in op]
COMPILED = [op for op in OPERATIONS if schema._compiled(op) is not None]
json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 70000) | st.floats(allow_nan=False)
                           | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                     max_size=4),
                           max_leaves=12)


def judge(operation_id: str, data) -> bool:
    return schema._validator(operation_id).is_valid(data)


def compiled_accepts(operation_id: str, data) -> bool:
    from fastjsonschema import JsonSchemaException
    try:
        schema._compiled(operation_id)(data)
        return True
    except JsonSchemaException:
        return False


def test_almost_every_operation_has_a_compiled_check_and_the_rest_say_why():
    assert set(COMPILED) >= {"createAllocation", "preferAllocation", "planMig", "applyMig", "putSharing"}
    # clearHealth's "all": {"const": true} would let 1 through in draft 7 code (1 == True).
    assert not schema._same_in_draft7(schema._schema("clearHealth"))
    assert not schema._same_in_draft7({"type": "object", "$ref": "#/x"})
    assert not schema._same_in_draft7({"prefixItems": [{"type": "string"}]})


def mutated(data):
    """``data`` with one thing changed, as a client gets a body wrong."""
    return st.sampled_from(["drop", "add", "retype"]).flatmap(lambda how: _mutation(data, how))


def _mutation(data, how):
    if not isinstance(data, dict) or not data:
        return json_values
    keys = sorted(data)
    if how == "drop":
        return st.sampled_from(keys).map(lambda k: {x: v for x, v in data.items() if x != k})
    if how == "add":
        return st.tuples(st.text(max_size=8), json_values).map(lambda kv: {**data, kv[0]: kv[1]})
    return st.tuples(st.sampled_from(keys), json_values).map(lambda kv: {**data, kv[0]: kv[1]})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.filter_too_much])
@given(data=st.data())
def test_the_compiled_check_accepts_only_what_jsonschema_accepts(data):
    operation_id = data.draw(st.sampled_from(COMPILED))
    valid = data.draw(from_schema(schema._schema(operation_id)))
    assert compiled_accepts(operation_id, valid)
    body = data.draw(st.one_of(mutated(valid), json_values))
    if compiled_accepts(operation_id, body):
        assert judge(operation_id, body), json.dumps(body)


def test_a_refused_body_gets_jsonschemas_words():
    with pytest.raises(UsageError, match=r"^body\.devices\[0\]: unknown key 'devic' \(did you mean 'device'\?\)"):
        schema.validate_body("createAllocation", {"id": "a", "devices": [{"devic": "0"}]})
    with pytest.raises(UsageError, match=r"^body\.devices\[0\]: matches none of the forms allowed here"):
        schema.validate_body("createAllocation", {"id": "a", "devices": ["0"]})


def test_a_refused_item_of_one_form_is_told_at_its_own_place():
    """An item that is plainly a named device, whose sharing is wrong deeper down, is told
    what is wrong there, not that another form has no key 'device'."""
    limit = "9" * 25
    item = {"device": "6", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}}}
    with pytest.raises(UsageError) as e:
        schema.validate_body("createAllocation", {"id": "a", "devices": [item], "own_mps_daemon": True})
    assert e.value.message.startswith(f"body.devices[0].sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '{limit}' "
                                      "is too long"), e.value.message
    item["sharing"]["mpsConfig"] = {"defaultPinnedDeviceMemoryLimit": "12Qi"}
    with pytest.raises(UsageError, match=r"^body\.devices\[0\]\.sharing\.mpsConfig\.defaultPinnedDeviceMemoryLimit: "
                                         r"'12Qi' does not match"):
        schema.validate_body("createAllocation", {"id": "a", "devices": [item]})


def test_valid_bodies_leave_jsonschema_unloaded():
    code = ("import sys; from hostagent.api import schema; "
            "schema.validate_body('createAllocation', {'id': 'a', 'devices': [{'device': '0'}]}); "
            "print('jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
