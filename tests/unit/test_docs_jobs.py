"""docs/jobs.md documents every field of JobSpec, and nothing else.

The rule (stated at the top of docs/jobs.md): every ``###`` heading is the
JSON path of one field, its names joined with dots (``retry.max_attempts``).
A field whose type is a union of models (``trigger``, ``execution``) gets
one heading per field name across all its variants (``trigger.expr``,
``execution.image``). Models count too: ``retry`` has its own heading.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from etcdsched.model.spec import JobSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"
HEADING = re.compile(r"^###\s+(.+?)\s*$", re.MULTILINE)


def nested_models(annotation: object) -> list[type[BaseModel]]:
    """The models inside a field's type: ``X``, ``X | None``, ``A | B``,
    ``Annotated[...]``, ``list[X]``..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in nested_models(arg)]


def field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field path of ``model`` as JSON spells it (aliases win)."""
    paths: set[str] = set()
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        paths.add(path)
        for nested in nested_models(info.annotation):
            paths |= field_paths(nested, path + ".")
    return paths


def documented_paths() -> set[str]:
    return {heading.strip("`") for heading in HEADING.findall(DOC.read_text())}


def test_walk_covers_trigger_and_execution_variants() -> None:
    paths = field_paths(JobSpec)
    assert {"trigger.expr", "trigger.every", "trigger.at", "trigger.dst.gap"} <= paths
    assert {"execution.argv", "execution.image", "retry.max_attempts"} <= paths


def test_every_field_has_a_heading() -> None:
    missing = sorted(field_paths(JobSpec) - documented_paths())
    assert not missing, f"docs/jobs.md has no '### <path>' heading for: {', '.join(missing)}"


def test_every_heading_names_a_field() -> None:
    unknown = sorted(documented_paths() - field_paths(JobSpec))
    assert not unknown, f"docs/jobs.md has headings for fields JobSpec lacks: {', '.join(unknown)}"
