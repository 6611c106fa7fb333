"""The one reader of configuration documents: YAML (and JSON, read as YAML) as go-yaml v2
reads it under sigs.k8s.io/yaml, bounded, with one-line errors."""

import json
import time

import pytest

from hostagent.errors import ConfigError
from hostagent.textdoc import MAX_NODES, decode, shown


def read(text):
    return decode(text, "doc.yaml", "test document")


@pytest.mark.parametrize("text, value", [
    ('{"a": [1, 2,],}', {"a": [1, 2]}),                                  # trailing commas
    ('{\n\t"a": {\n\t\t"b": [\n\t\t\t1\n\t\t]\n\t}\n}', {"a": {"b": [1]}}),     # Go's JSON indentation
    ("a: b\t# a comment after a tab\n", {"a": "b"}),
    ("a: 2.0\nb: 1e3\nc: -0.0\nd: 2.5\n", {"a": 2, "b": 1000, "c": 0, "d": 2.5}),   # through JSON: 2.0 is 2
    ("a: 0o17\nb: 017\nc: 0x1F\nd: 1_000\ne: +3\n", {"a": 15, "b": 15, "c": 31, "d": 1000, "e": 3}),
    ("a: 1:30\nb: 2024-01-02\nc: yes\nd: off\ne: ~\n",                   # go-yaml's YAML 1.1 typing
     {"a": "1:30", "b": "2024-01-02", "c": True, "d": False, "e": None}),
    ("off: 1\n'on': 2\n3: 3\n", {"off": 1, "on": 2, "3": 3}),           # keys stay strings as written
    ("a: !!str 12\nb: !!float 3\nc: '7'\n", {"a": "12", "b": 3, "c": "7"}),
    ("base: &b {x: 1, y: 2}\nc: {<<: *b, y: 3}\nd: {<<: [{x: 5}, *b]}\n",
     {"base": {"x": 1, "y": 2}, "c": {"x": 1, "y": 3}, "d": {"x": 5, "y": 2}}),
    ("", None),
])
def test_documents_read_as_go_yaml_reads_them(text, value):
    assert read(text) == value


@pytest.mark.parametrize("text, says", [
    ("a: .nan\n", "doc.yaml:1:4: a: .nan is not a number a JSON document can hold"),
    ("a: [1, -.inf]\n", "doc.yaml:1:8: a[1]: -.inf is not a number a JSON document can hold"),
    ("a: !!binary aGk=\n", "doc.yaml:1:4: a: the YAML tag tag:yaml.org,2002:binary is not supported"),
    ("a: !!int x\n", "doc.yaml:1:4: a: 'x' is not a YAML int"),
    ("? [1]\n: 2\n", "a mapping key must be a single value"),
    ("a: {<<: 1}\n", "a: '<<' merges a mapping or a list of mappings"),
    ('{"a": 1,, }', "doc.yaml:1:9: not valid JSON: Expecting property name"),     # JSON's own words
    ("a: [\n", "doc.yaml:2:1: not valid YAML or JSON"),
    ("a:\n\t- 1\n", "doc.yaml:2:1: not valid YAML or JSON"),           # a tab indenting a block: as go-yaml
])
def test_what_is_not_a_document_is_one_line(text, says):
    with pytest.raises(ConfigError) as e:
        read(text)
    assert says in e.value.message and "\n" not in e.value.message


def bomb(levels: int) -> str:
    """The billion laughs: each anchor a list of nine aliases of the one before."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once():
    started = time.monotonic()
    with pytest.raises(ConfigError) as e:
        read(bomb(9))                            # 9^9 values: gigabytes, had it been expanded
    assert time.monotonic() - started < 5
    assert e.value.message == (f"doc.yaml: has more than {MAX_NODES} values (aliases expanded), more than any "
                               "test document needs; not read")
    with pytest.raises(ConfigError, match="nested too deeply"):
        read("a: &a [*a]\n")                      # an alias of the list it is in


def test_every_reader_of_configuration_refuses_the_bomb(tmp_path):
    from hostagent.cdi.validate import read_spec
    from hostagent.config import load_config
    from hostagent.mig.hooks import parse_hooks
    from hostagent.mig.spec import parse_spec
    from hostagent.sharing.config import load_text
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb(8))
    readers = [lambda: load_config(path), lambda: load_text(bomb(8), str(path)), lambda: read_spec(path),
               lambda: parse_spec(bomb(8), str(path)), lambda: parse_hooks(bomb(8), str(path))]
    for reader in readers:
        started = time.monotonic()
        with pytest.raises(ConfigError, match=f"{path}: has more than {MAX_NODES} values"):
            reader()
        assert time.monotonic() - started < 5


def test_values_quoted_in_messages_are_cut():
    """A bomb within the bound still expands to tens of thousands of values: an error about
    it quotes a few characters of it, not megabytes."""
    from hostagent.config import validate_data
    from hostagent.sharing.config import load_text
    nine = "[" + ", ".join(["*l3"] * 9) + "]"                    # 9^5 strings, within MAX_NODES
    sharing = bomb(4) + f"sharing:\n  mps:\n    resources:\n    - {{name: gpu, replicas: 2, devices: {nine}}}\n"
    with pytest.raises(ConfigError) as e:
        load_text(sharing, "share.yaml")
    assert "devices[0]: [[[[" in e.value.message and "; and 6 more" in e.value.message
    assert len(e.value.message) < 600
    with pytest.raises(ConfigError) as e:
        load_text(bomb(4) + f"version: {nine}\n", "share.yaml")
    assert "version: unknown version [[[[" in e.value.message and len(e.value.message) < 600
    with pytest.raises(ConfigError) as e:
        validate_data(read(bomb(4) + f"labels:\n  mig_strategy: {nine}\n"), "config.yaml")
    assert "labels.mig_strategy: " in e.value.message and len(e.value.message) < 600
    assert len(shown("x" * 10_000)) <= 60 and len(shown(list(range(10_000)))) <= 60


def test_api_bodies_read_numbers_the_same_way():
    from hostagent.api.schema import parse_json
    assert parse_json(json.dumps({"replicas": 2.0, "x": [1.5, 3e2]}).encode()) == {"replicas": 2, "x": [1.5, 300]}
    assert type(parse_json(b'{"n": 4.0}')["n"]) is int
