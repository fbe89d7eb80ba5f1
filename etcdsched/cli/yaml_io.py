"""Reading job files (YAML or JSON) with errors a person can act on, and
the one-line error every CLI command prints.

PyYAML's own message spans several lines (the problem, the context, a copy
of the offending line); a terminal user and an editor both want the
compiler's form instead, ``many.yaml:12:5: mapping values are not allowed
here``, which most editors can jump to.
"""

from __future__ import annotations

import json
from typing import IO, Any

import click
import yaml

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader when PyYAML has it: ten times faster on big files."""


class CliFailure(click.ClickException):
    """An error said on one stderr line, ``error: ...``, as the API's errors
    are (click's own form is ``Error: ...``); exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


class YamlSyntaxError(click.ClickException):
    """A file that is not YAML: ``name:line:column: problem`` alone, so the
    position leads the line and no PyYAML dump follows."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.format_message(), err=True, file=file)


def read_documents(text: str, name: str) -> list[Any]:
    """The documents of a job file: one JSON value, or each document of a
    YAML stream (empty ones dropped). ``name`` (a path, ``<stdin>``) leads
    the error line of a file that is neither."""
    if text.lstrip().startswith(("[", "{")):
        try:
            return [json.loads(text)]
        except ValueError:
            pass  # YAML flow style, say: YAML reads it below
    try:
        return [doc for doc in yaml.load_all(text, Loader=_YAML_LOADER) if doc is not None]
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(describe_yaml_error(exc, text, name)) from None


def name_of(file: IO[Any]) -> str:
    """The name a file's errors go by: its path as given, or ``<stdin>``."""
    name = getattr(file, "name", None)
    return name if isinstance(name, str) and name not in ("-", "") else "<stdin>"


def describe_yaml_error(exc: yaml.YAMLError, text: str, name: str) -> str:
    """``name:line:column: problem (context)`` on one line, counted from 1.
    The marks of a YAML stream count from the start of the file, not of the
    document, so the position is right in a file of many documents too."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "not YAML"
        context = ""
        if exc.context and exc.problem and exc.context_mark is not None:
            where = f"{exc.context_mark.line + 1}:{exc.context_mark.column + 1}"
            context = f" ({exc.context} started at {where})"
        if mark is not None:
            return f"{name}:{mark.line + 1}:{mark.column + 1}: {problem}{context}"
        return f"{name}: {problem}{context}"
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character  # libyaml: an int; PyYAML: a str, or bytes it cannot decode
        code = char if isinstance(char, int) else ord(char[:1] or "?")
        return f"{name}:{line}:{column}: unacceptable character #x{code:04x}: {exc.reason}"
    return f"{name}: " + " ".join(str(exc).split())


def dump(data: Any) -> str:
    """YAML in the order the data has (a spec reads top-down as documented)."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
