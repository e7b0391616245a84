"""The file helpers: JSON text a person reads a line per entry, and that json reads back unchanged."""

import json
from pathlib import Path

import pytest

from tensoropt._io import json_text, write_json_atomic

DOCUMENTS = [
    {},
    [],
    {"a": 1},
    {1: {2: 3, True: None}, None: [1, {"x": 1}], 2.5: "f"},
    {"format": "x/1", "configs": {"n1": {"devices": ["gpu0"], "layout": "R"}, "n2": {"devices": ["gpu1"]}},
     "order": ["n1", "n2"], "empty": {}, "one": {"k": [1, 2]}, "nested": [{"a": [1, {"b": None}]}, [2.5, "é"]],
     "text": "line\nbreak \"quoted\"", "number": 1e-300, "flag": True},
    [{"a": 1}, {"b": [1, 2]}],
    [1, 2, 3],
    "a string",
    3,
    None,
]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_json_text_reads_back_as_the_json_module_writes_it(doc, tmp_path):
    expected = json.loads(json.dumps(doc))   # the same document (keys that are not strings as their JSON text)
    assert json.loads(json_text(doc)) == expected
    path = write_json_atomic(tmp_path / "d.json", doc)
    assert json.loads(path.read_text(encoding="utf-8")) == expected


def test_an_object_has_an_entry_per_line():
    text = json_text({"configs": {"n1": {"layout": "R"}, "n2": {"layout": "batch"}}, "order": ["n1", "n2"]})
    assert text.splitlines() == ['{', ' "configs": {', '  "n1": {"layout": "R"},', '  "n2": {"layout": "batch"}',
                                 ' },', ' "order": ["n1", "n2"]', '}']


def test_load_yaml_reads_what_safe_load_reads():
    import yaml

    from tensoropt._io import load_yaml

    text = (Path(__file__).resolve().parents[1] / "tensoropt" / "devicemodel" / "kinds.yaml").read_text()
    assert load_yaml(text) == yaml.safe_load(text)
    for bad in ("a: [1, 2", "a: b: c", "!!python/object:os.system {}"):
        with pytest.raises(yaml.YAMLError):
            yaml.safe_load(bad)
        with pytest.raises(yaml.YAMLError):
            load_yaml(bad)
