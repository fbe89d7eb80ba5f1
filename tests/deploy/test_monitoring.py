"""The shipped monitoring (issue 31): Prometheus rules, their unit tests,
the scrape config and the Grafana dashboard, checked against the code.

``promtool`` (Debian's ``prometheus`` package; ``.ci/run`` installs it)
checks the rules, runs their unit tests (docker/prometheus/alerts_test.yaml),
checks the config and parses every dashboard query. Without a Prometheus
server the dashboard and the rules could still name a metric etcdsched
never exports, or a label it does not have, and stay silent for ever; the
static checks here compare each expression with the metrics that
etcdsched/runtime/metrics.py defines, and one test scrapes a real agent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from etcdsched.config import Config
from etcdsched.runtime import metrics
from tests.support.eventually import wait_until
from tests.support.up_process import Tour

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "docker" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yaml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yaml"
CONFIG = PROMETHEUS / "prometheus.yml"
DASHBOARD = ROOT / "docker" / "grafana" / "etcdsched-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"

SCRAPE_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""
PROMETHEUS_OWN = {"up": frozenset(), "ALERTS": frozenset({"alertname", "alertstate", "severity"})}
"""Series Prometheus makes itself, with the labels the expressions may use."""
METRIC_TOKEN = re.compile(r"\b(?:etcdsched[_:][A-Za-z0-9_:]*|up|ALERTS)\b")
MATCHERS = re.compile(r"\{([^{}]*)\}")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


@dataclass(frozen=True)
class Family:
    """A metric family as the exposition shows it: name, type, labels."""

    name: str
    kind: str
    labels: tuple[str, ...]

    def series(self) -> dict[str, frozenset[str]]:
        """The series names it exports, each with the labels it may carry."""
        own = frozenset(self.labels)
        if self.kind == "counter":
            return {f"{self.name}_total": own, f"{self.name}_created": own}
        if self.kind == "histogram":
            return {
                f"{self.name}_bucket": own | {"le"},
                f"{self.name}_count": own,
                f"{self.name}_sum": own,
                f"{self.name}_created": own,
            }
        return {self.name: own}


def defined_families() -> list[Family]:
    """Every metric object of etcdsched/runtime/metrics.py (all on its
    REGISTRY), read from the objects themselves: a labelled metric with no
    child yet shows no sample, so the registry's output alone would hide
    its labels."""
    families = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            (described,) = value.describe()
            labels = tuple(value._labelnames)
            families.append(Family(described.name, described.type, labels))
    return families


def known_series() -> dict[str, frozenset[str]]:
    series: dict[str, frozenset[str]] = dict(PROMETHEUS_OWN)
    for family in defined_families():
        series.update(family.series())
    return series


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in load_rules() if "alert" in rule]


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> dict[str, str]:
    """Each query of the dashboard, named by its panel and refId."""
    return {
        f"{panel['title']}/{target['refId']}": target["expr"]
        for panel in all_panels(load_dashboard())
        for target in panel.get("targets", [])
    }


def rule_exprs() -> dict[str, str]:
    return {rule.get("alert") or rule["record"]: rule["expr"] for rule in load_rules()}


def unknown_names(expr: str, series: dict[str, frozenset[str]], records: set[str]) -> list[str]:
    """Metric names and labels in ``expr`` that nothing exports. A label
    counts as known if any metric named in the same expression has it."""
    names = set(METRIC_TOKEN.findall(expr))
    problems = sorted(n for n in names - records if n not in series)
    allowed = set(SCRAPE_LABELS)
    for name in names & series.keys():
        allowed |= series[name]
    used = {label for body in MATCHERS.findall(expr) for label in LABEL_NAME.findall(body)}
    for body in GROUPING.findall(expr):
        used |= {label.strip() for label in body.split(",") if label.strip()}
    problems += sorted(f"label {label}" for label in used - allowed)
    return problems


# --- promtool -----------------------------------------------------------------
@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/run installs it)")
    return path


def run_promtool(promtool: str, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_promtool_checks_the_alert_rules(promtool: str) -> None:
    output = run_promtool(promtool, "check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(load_rules())} rules found" in output


def test_promtool_unit_tests_of_the_alerts_pass(promtool: str) -> None:
    assert "SUCCESS" in run_promtool(promtool, "test", "rules", str(ALERTS_TEST))


def test_promtool_checks_the_scrape_config_and_its_rule_files(promtool: str) -> None:
    output = run_promtool(promtool, "check", "config", str(CONFIG))
    assert "SUCCESS: 1 rule files found" in output


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    """Grafana's ``$__rate_interval`` becomes a literal range, then each
    query is a recording rule for promtool to parse."""
    queries = {
        title: expr.replace("$__rate_interval", "5m") for title, expr in dashboard_exprs().items()
    }
    rules = [{"record": f"dashboard:query:{i}", "expr": e} for i, e in enumerate(queries.values())]
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", str(path))


# --- the rules ----------------------------------------------------------------
def test_every_alert_has_a_delay_a_severity_and_a_runbook_section() -> None:
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alert_rules():
        name = rule["alert"]
        assert rule.get("for"), f"{name}: no `for:`"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert path == "docs/operations.md", name
        assert anchor == name.lower() and anchor in headings, f"{name}: no runbook heading"


def expected_partitions() -> int:
    (rule,) = [r for r in load_rules() if r.get("record") == "etcdsched:partitions:expected"]
    match = re.fullmatch(r"vector\((\d+)\)", rule["expr"].strip())
    assert match, rule["expr"]
    return int(match.group(1))


def test_the_expected_partition_count_is_the_default_of_cluster_init() -> None:
    assert expected_partitions() == Config.model_fields["partitions"].default


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    cases = [
        case
        for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never seen firing"
    assert names - silent == set(), "alerts never seen silent"


def test_rules_name_only_exported_metrics_and_their_real_labels() -> None:
    series = known_series()
    records = {rule["record"] for rule in load_rules() if "record" in rule}
    problems = {
        name: unknown
        for name, expr in rule_exprs().items()
        if (unknown := unknown_names(expr, series, records))
    }
    assert problems == {}


# --- the dashboard --------------------------------------------------------------
def test_dashboard_is_an_importable_grafana_model() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39 and dashboard["uid"] and dashboard["title"]
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = list(all_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    queried = [panel for panel in panels if panel["type"] != "row"]
    for panel in queried:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(load_dashboard()):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_dashboard_names_only_exported_metrics_and_their_real_labels() -> None:
    series = known_series()
    records = {rule["record"] for rule in load_rules() if "record" in rule}
    problems = {
        title: unknown
        for title, expr in dashboard_exprs().items()
        if (unknown := unknown_names(expr, series, records))
    }
    assert problems == {}


def test_dashboard_shows_every_metric_the_code_defines() -> None:
    shown = {n for expr in dashboard_exprs().values() for n in METRIC_TOKEN.findall(expr)}
    for family in defined_families():
        assert set(family.series()) & shown, f"{family.name} is on no panel"


# --- a real agent -----------------------------------------------------------------
@pytest.fixture
def tour(tmp_path: Path) -> Iterator[Tour]:
    t = Tour(tmp_path)
    yield t
    t.close()


def scrape(tour: Tour) -> str:
    url = f"http://127.0.0.1:{tour.api_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.slow
def test_a_running_agent_exports_what_the_rules_and_dashboard_use(tour: Tour) -> None:
    """``etcdsched up`` (every role) runs one job, then its ``/metrics`` is
    linted by ``promtool check metrics`` when present, and every series the
    rules and dashboard use is in it, or declared by a labelled metric that
    has no child yet (a counter appears with its first label values), or
    awaited (test_awaited_metrics_are_defined says which)."""
    tour.spawn("up", "--port", str(tour.api_port))
    wait_until(tour.ready, timeout=60)
    tour.cli("job", "create", "--id", "tick", "--now", "--", "true")
    wait_until(lambda: "succeeded" in tour.cli("job", "runs", "tick"), timeout=60)
    text = scrape(tour)
    if (promtool := shutil.which("promtool")) is not None:
        run_promtool(promtool, "check", "metrics", stdin=text)
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    exported = {sample.name for sample in samples}
    owned = [s.value for s in samples if s.name == "etcdsched_partitions_owned"]
    assert owned == [expected_partitions()], "one scheduler owns every partition"
    assert "etcdsched_start_lag_seconds_count" in exported and "etcdsched_fires_total" in exported
    declared = known_series()
    unlabelled = {name for name, labels in declared.items() if not labels - {"le"}}
    awaited = set(known_series()) - set(declared)
    records = {rule["record"] for rule in load_rules() if "record" in rule}
    used = (
        {
            name
            for expr in [*rule_exprs().values(), *dashboard_exprs().values()]
            for name in METRIC_TOKEN.findall(expr)
        }
        - records
        - set(PROMETHEUS_OWN)
    )
    assert used - exported - awaited <= declared.keys() - unlabelled, "declared but not served"
    assert (used & unlabelled) - exported == set(), "an unlabelled metric is not served"
