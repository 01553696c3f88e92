"""compose.yaml: valid against the Compose specification's JSON schema (the copy that
check-jsonschema vendors), every splatq service runs a command the CLI accepts with only real
settings, from the project's image, hardened like the Kubernetes pods; Redis keeps an AOF and
never evicts; the storage is the MinIO bucket the setup service creates."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from splatq.shared.settings import Settings, SettingsError
from tests.deploy.manifests import (
    DEV_DEPENDENCY_IMAGES,
    PACKAGE_VERSION,
    REPO_ROOT,
    cli_problem,
    image_name_and_tag,
    is_project_image,
    splatq_invocations,
    unknown_variables,
)

COMPOSE = REPO_ROOT / "compose.yaml"
SERVICES = ("gateway", "worker", "dispatcher", "redriver", "settler")


@cache
def compose_schema() -> dict[str, Any]:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text(encoding="utf-8"))
    return schema


def schema_problems(doc: dict[str, Any]) -> list[str]:
    validator_class = jsonschema.validators.validator_for(compose_schema())
    validator = validator_class(compose_schema())
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


@cache
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def splatq_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if is_project_image(s["image"])}


def entrypoint() -> list[str]:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    found = re.findall(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M)
    argv: list[str] = json.loads(found[-1])
    return argv


def argv_of(service: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint (the image's unless overridden) + command."""
    if "entrypoint" in service:
        return list(service["entrypoint"]) + list(service.get("command", []))
    return entrypoint() + list(service.get("command", []))


def test_compose_matches_the_compose_specification() -> None:
    assert schema_problems(compose()) == []
    broken = copy.deepcopy(compose())
    broken["services"]["gateway"]["restart_policy"] = "always"  # a deploy: key, misplaced
    assert schema_problems(broken)
    wrong = copy.deepcopy(compose())
    wrong["services"]["redis"]["depends_on"] = "minio"  # a list or a mapping
    assert schema_problems(wrong)


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(
        ["docker", "compose", "version"], capture_output=True, check=False
    ).returncode,
    reason="the docker compose plugin is not installed: the schema check above stands for it",
)
def test_docker_compose_reads_the_file() -> None:
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_every_service_of_the_stack_runs_from_the_one_image() -> None:
    ran = set()
    for name, service in splatq_services().items():
        assert image_name_and_tag(service["image"]) == ("splatq", PACKAGE_VERSION), name
        assert service["build"]["context"] == "."
        for args in splatq_invocations(argv_of(service)):
            assert cli_problem(args) is None, (name, args, cli_problem(args))
            ran.add(args[0])
        test = (service.get("healthcheck") or {}).get("test")
        if test:
            assert test[0] == "CMD"
            for args in splatq_invocations(test[1:]):
                assert cli_problem(args) is None, (name, args)
    assert set(SERVICES) <= ran
    for name, service in services().items():
        if not is_project_image(service["image"]):
            assert service["image"] in DEV_DEPENDENCY_IMAGES, name


def test_every_variable_is_a_real_setting_and_valid() -> None:
    allow_private = {}
    for name, service in splatq_services().items():
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        assert unknown_variables(set(env)) == set(), name
        try:
            Settings.from_env(env)
        except SettingsError as exc:
            pytest.fail(f"{name}: {exc}")
        allow_private[name] = env.get("SPLATQ_WEBHOOK_ALLOW_PRIVATE", "0")
    assert {n for n, v in allow_private.items() if v != "0"} == {"dispatcher"}


def test_every_container_is_hardened() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    [user] = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    for name, service in services().items():
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert "/tmp" in service.get("tmpfs", []), name
        assert "privileged" not in service, name
        assert "cap_add" not in service, name
        if name in splatq_services():
            assert service["user"] == user, name
    for published in (p for s in services().values() for p in s.get("ports", [])):
        assert published.startswith("127.0.0.1:"), published  # this machine only


def test_redis_keeps_an_aof_and_never_evicts() -> None:
    redis = services()["redis"]
    command = redis["command"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    [volume] = redis["volumes"]
    name, _, mount = volume.partition(":")
    assert mount == options["--dir"]
    assert name in compose()["volumes"]
    for name, service in splatq_services().items():
        assert service["environment"]["SPLATQ_REDIS_URL"] == "redis://redis:6379/0", name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_storage_is_the_minio_bucket_the_setup_creates() -> None:
    bucket_service = services()["minio-bucket"]
    bucket = bucket_service["entrypoint"][-1].partition("/")[2]
    host = bucket_service["environment"]["MC_HOST_dev"].rpartition("@")[2]
    minio = services()["minio"]
    assert minio["environment"]["MINIO_ROOT_USER"] in bucket_service["environment"]["MC_HOST_dev"]
    for name, service in splatq_services().items():
        env = service["environment"]
        assert env["SPLATQ_STORAGE_URL"].startswith(f"s3://{bucket}/"), name
        assert env["SPLATQ_S3_ENDPOINT_URL"] == f"http://{host}", name
        assert env["AWS_ACCESS_KEY_ID"] == minio["environment"]["MINIO_ROOT_USER"], name
        if name != "dev-key":
            depends = service["depends_on"]["minio-bucket"]["condition"]
            assert depends == "service_completed_successfully", name
    for name, service in services().items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services(), (name, dependency)
