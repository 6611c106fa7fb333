"""Every route the API serves is in the OpenAPI document, with the same least role, and
every documented operation is served."""

from hostagent.api.routes import App
from hostagent.api.schema import document


def served() -> dict:
    out = {}
    for path, routes in App.EXACT.items():
        for r in routes:
            out[(path, r.method.lower())] = r.role
    for prefix, routes in App.PREFIX.items():
        for r in routes:
            out[(App.PATTERNS[prefix], r.method.lower())] = r.role
    return out


def test_routes_and_document_agree():
    doc = document()
    documented = {(path, method): op["x-hostagent-role"]
                  for path, item in doc["paths"].items() for method, op in item.items()}
    assert served() == documented


def test_request_bodies_are_validated_by_operation_id():
    from hostagent.api.schema import validate_body
    from hostagent.errors import UsageError
    import pytest
    for body in ({"all": True}, {"devices": ["0", "1:3"]}):
        validate_body("clearHealth", body)
    for body in ({}, {"all": False}, {"devices": []}, {"devices": [""]}, {"devices": ["0"], "all": True},
                 {"all": True, "force": 1}):
        with pytest.raises(UsageError):
            validate_body("clearHealth", body)
