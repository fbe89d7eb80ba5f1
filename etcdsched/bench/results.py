"""What a scenario hands back, the targets it is judged against, and the
results file (``bench-results/<timestamp>.json``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class Target:
    """A goal from the brief: ``value`` must be ``<= limit`` (``lower``) or
    ``>= limit`` (``higher``). ``value`` None: not measured (say why)."""

    name: str
    value: float | None
    limit: float
    better: Literal["lower", "higher"]
    unit: str = ""
    why_missing: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        return self.value <= self.limit if self.better == "lower" else self.value >= self.limit

    def margin(self) -> str:
        """By how much it was met or missed, in the target's unit and as a ratio."""
        if self.met is None:
            return self.why_missing or "not measured"
        assert self.value is not None
        if math.isinf(self.value):
            return "missed: some runs had not started when the drain timed out"
        diff = abs(self.value - self.limit)
        ratio = self.value / self.limit if self.limit else math.inf
        verdict = "met" if self.met else "missed"
        return f"{verdict} by {_num(diff)}{self.unit} ({ratio:.2f}x the limit)"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met, "margin": self.margin()}


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class ScenarioResult:
    name: str
    title: str
    params: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    """Data for the figures: per-second counts, lag quantile curves."""
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    """Headline numbers other scenarios may use (raw put rate for the ratio)."""
    error: str | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["targets"] = [t.to_json() for t in self.targets]
        return data


def target_from_json(data: dict[str, Any]) -> Target:
    return Target(
        data["name"],
        data["value"],
        data["limit"],
        data["better"],
        data.get("unit", ""),
        data.get("why_missing", ""),
    )


def result_from_json(data: dict[str, Any]) -> ScenarioResult:
    return ScenarioResult(
        name=data["name"],
        title=data["title"],
        params=data.get("params", {}),
        tables=[Table(**t) for t in data.get("tables", [])],
        targets=[target_from_json(t) for t in data.get("targets", [])],
        series=data.get("series", {}),
        notes=data.get("notes", []),
        metrics=data.get("metrics", {}),
        error=data.get("error"),
        seconds=data.get("seconds", 0.0),
    )


def write_results(path: Path, meta: dict[str, Any], results: list[ScenarioResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "scenarios": [r.to_json() for r in results]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
    tmp.replace(path)


def read_results(path: Path) -> tuple[dict[str, Any], list[ScenarioResult]]:
    document = json.loads(path.read_text())
    return document["meta"], [result_from_json(s) for s in document["scenarios"]]


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
