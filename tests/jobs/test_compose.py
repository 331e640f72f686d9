"""docker-compose.yml, checked by parsing it (no Docker engine here): the services, pinned images, the
Label Studio settings that allow a local backend, health checks, start order, shared volumes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
PINNED = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*$")  # name:1.2[.3][-variant], never latest


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_and_pinned_images(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "label-studio", "ml-backend", "worker", "beat",
                             "rater-page"}
    assert services["label-studio"]["image"] == "heartexlabs/label-studio:1.23.2"
    for name, service in services.items():
        assert PINNED.match(service["image"]), f"{name}: image {service['image']!r} is not pinned"
    base = re.search(r"^FROM (\S+)", services["ml-backend"]["build"]["dockerfile_inline"], re.M).group(1)
    assert PINNED.match(base), base


def test_label_studio_is_locked_down_and_uses_postgres(compose):
    """SSRF protection on, with exactly the ML backend's fixed address allowed; staff-only sign-up;
    published on this machine only; the jobs' Redis wants a password."""
    import ipaddress

    from sense7.labelstudio.label_studio_process import banned_subnets

    env = compose["services"]["label-studio"]["environment"]
    assert env["ML_BLOCK_LOCAL_IP"] == "true" and env["SSRF_PROTECTION_ENABLED"] == "true"
    backend_ip = compose["services"]["ml-backend"]["networks"]["default"]["ipv4_address"]
    assert ipaddress.ip_address(backend_ip) in ipaddress.ip_network(
        compose["networks"]["default"]["ipam"]["config"][0]["subnet"])
    banned = env["USER_ADDITIONAL_BANNED_SUBNETS"].split(",")
    assert banned == banned_subnets([backend_ip])
    def blocked(ip):
        return any(ipaddress.ip_address(ip) in ipaddress.ip_network(s) for s in banned)
    assert not blocked(backend_ip) and blocked("172.28.0.11") and blocked("127.0.0.1") and blocked("10.0.0.1")
    assert env["LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK"] == "true"
    assert env["DJANGO_DB"] == "postgresql" and env["POSTGRE_HOST"] == "postgres"
    assert env["LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN"] == "true"
    assert compose["services"]["label-studio"]["ports"] == ["127.0.0.1:8080:8080"]
    assert "--requirepass" in " ".join(compose["services"]["redis"]["command"])
    assert "${SENSE7_REDIS_PASSWORD" in COMPOSE.read_text() and ":${SENSE7_REDIS_PASSWORD" in COMPOSE.read_text()


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(compose):
    services = compose["services"]
    for name, service in services.items():
        assert service["healthcheck"]["test"], name
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in services and cond["condition"] == "service_healthy", (name, dep)
    assert set(services["worker"]["depends_on"]) >= {"redis", "label-studio", "ml-backend"}
    assert set(services["ml-backend"]["depends_on"]) >= {"redis", "postgres"}


def test_jobs_and_backend_share_configuration_and_models(compose):
    backend, worker = compose["services"]["ml-backend"], compose["services"]["worker"]
    env = worker["environment"]
    assert {k: v for k, v in backend["environment"].items() if k in env} == env
    assert backend["environment"]["SENSE7_BACKEND_ON_EVENT"] == "sense7.tasks.sync:on_event"
    assert env["SENSE7_REDIS_URL"].startswith("redis://:${SENSE7_REDIS_PASSWORD") and "@redis:6379/" in env["SENSE7_REDIS_URL"]
    assert env["SENSE7_LS_URL"] == "http://label-studio:8080"
    assert env["SENSE7_STORE_URL"].startswith("postgresql") and "@postgres:5432/" in env["SENSE7_STORE_URL"]
    assert env["SENSE7_BACKEND_URL"] == "http://ml-backend:9090"
    # The worker writes model versions, the backend serves them: one volume, mounted at SENSE7_HOME.
    assert backend["volumes"] == worker["volumes"] == ["sense7-data:/data"]
    assert env["SENSE7_MODEL_DIR"].startswith(env["SENSE7_HOME"])
    assert "sense7.ml_backend.wsgi:app_from_env()" in backend["command"]
    assert worker["command"][:2] == ["sense7", "worker"]


def test_no_secret_is_written_in_the_file(compose):
    text = COMPOSE.read_text()
    for key in ("SENSE7_LS_TOKEN", "SENSE7_WEBHOOK_SECRET", "SENSE7_BACKEND_PASSWORD", "POSTGRES_PASSWORD",
                "LABEL_STUDIO_PASSWORD", "LABEL_STUDIO_USER_TOKEN"):
        for match in re.finditer(rf"{key}: (.+)", text):
            assert match.group(1).startswith("${"), f"{key} must come from the environment: {match.group(0)}"


def test_entry_points_named_in_the_file_exist(compose):
    import importlib

    from sense7.tasks.celery_app import app

    env = compose["services"]["ml-backend"]["environment"]
    module, _, name = env["SENSE7_BACKEND_ON_EVENT"].partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    assert (COMPOSE.parent / "ml_backend" / "gunicorn_conf.py").exists()
    assert "sense7.reconcile" in app.conf.beat_schedule["reconcile-labels"]["task"]
    assert app.conf.beat_schedule["deliver-submissions"]["task"] == "sense7.deliver_submissions"


def test_rater_page_service_runs_the_page_and_publishes_it_on_this_machine_only(compose):
    import importlib

    page = compose["services"]["rater-page"]
    assert page["ports"] == ["127.0.0.1:8090:8090"]
    assert (COMPOSE.parent / page["command"][2]).exists()
    module, _, factory = page["command"][-1].partition(":")
    assert callable(getattr(importlib.import_module(module), factory.rstrip("()")))
    assert page["environment"]["SENSE7_STORE_URL"] == compose["services"]["worker"]["environment"]["SENSE7_STORE_URL"]


def test_workers_scale_without_multiplying_the_schedule(compose):
    """`docker compose up --scale worker=3` must not start three schedulers: the worker runs without
    beat, one `beat` service runs the schedule, and nothing pins the worker to one container."""
    worker, beat = compose["services"]["worker"], compose["services"]["beat"]
    assert worker["command"][:2] == ["sense7", "worker"] and "--no-beat" in worker["command"]
    assert "--beat" not in worker["command"] and "-B" not in worker["command"]
    assert "container_name" not in worker and "ports" not in worker
    assert beat["command"] == ["sense7", "beat"]
    assert (beat.get("deploy") or {}).get("replicas", 1) == 1
    # beat reaches the same broker with the same settings as the workers it feeds.
    assert beat["environment"] == worker["environment"]

