"""A job file that is not YAML is said on one line, ``name:line:col:
problem``, with the position counted from the start of the file (issue 29:
PyYAML's several-line dump, and a traceback for a control character)."""

from __future__ import annotations

import pytest
import yaml

from etcdsched.cli.yaml_io import YamlSyntaxError, describe_yaml_error, read_documents

STREAM = "a: 1\n---\nb: 2\n---\nc: [1, 2\nd: 4\n"


@pytest.mark.parametrize("loader", [yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)])
@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("a: 1\nb: c: d\n", "f.yaml:2:5: "),
        (STREAM, "f.yaml:6:2: "),
        ("a: \x07\n", "f.yaml:1:4: unacceptable character #x0007: "),
    ],
)
def test_the_error_is_one_line_led_by_its_position(
    loader: type[yaml.SafeLoader], text: str, where: str
) -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        list(yaml.load_all(text, Loader=loader))
    said = describe_yaml_error(caught.value, text, "f.yaml")
    assert said.startswith(where), said
    assert "\n" not in said


def test_read_documents_raises_the_one_line_error() -> None:
    with pytest.raises(YamlSyntaxError) as caught:
        read_documents("x: [1\n", "<stdin>")
    assert caught.value.format_message().startswith("<stdin>:2:1: ")
    assert read_documents('{"a": 1}', "j.json") == [{"a": 1}]
    assert read_documents("a: 1\n---\n---\nb: 2\n", "y.yaml") == [{"a": 1}, {"b": 2}]
