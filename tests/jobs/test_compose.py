"""docker-compose.yml, checked by parsing it (no Docker engine here): the services, pinned images, the
Label Studio settings that allow a local backend, health checks, start order, and the several-host topology:
each sense7 service runs the command tests/deploy/test_multi_home.py runs, with the settings it gives every host
(sense7/deployment.py holds both), in a volume of its own, behind the shipped HAProxy config."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sense7.deployment import (BACKGROUND_CPU_SHARES, LABEL_STUDIO_NICE, SERVICE_COMMANDS, SERVICE_NICE, SERVICE_SETTINGS,
                               SHARED_SECRETS, SHARED_SETTINGS, self_signed)
from tests.support.deployment import haproxy_binary

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
PROXY_CONFIG = "deploy/haproxy/rater-page.cfg"
PINNED = re.compile(r"^[\w./-]+:\d+(\.\d+)+[\w.-]*$")  # name:1.2[.3][-variant], never latest


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_and_pinned_images(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "label-studio", "ml-backend", "worker", "beat",
                             "rater-page", "rater-page-2", "haproxy"}
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
    # The worker writes model versions into the store, the backend caches them in its own home.
    assert "volumes" not in worker and backend["volumes"] == ["backend-home:/data"]
    assert env["SENSE7_MODEL_DIR"].startswith(env["SENSE7_HOME"])
    assert "sense7.ml_backend.wsgi:app_from_env()" in backend["command"]
    assert worker["command"][:2] == ["sense7", "worker"]


def test_no_secret_is_written_in_the_file(compose):
    text = COMPOSE.read_text()
    for key in ("SENSE7_LS_TOKEN", "SENSE7_WEBHOOK_SECRET", "SENSE7_BACKEND_PASSWORD", "POSTGRES_PASSWORD",
                "LABEL_STUDIO_PASSWORD", "LABEL_STUDIO_USER_TOKEN", "SENSE7_RATER_PAGE_SECRET",
                r"SENSE7_CROWD_SECRET_\w+"):
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


def test_rater_pages_run_the_page_and_only_the_proxy_is_published_on_this_machine_only(compose):
    import importlib

    services = compose["services"]
    page = services["rater-page"]
    assert "ports" not in page and "ports" not in services["rater-page-2"]
    assert all(port.startswith("127.0.0.1:") for port in services["haproxy"]["ports"])
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



def sense7_services(compose: dict) -> dict:
    """The services running the sense7 image."""
    return {name: s for name, s in compose["services"].items() if s.get("image", "").startswith("sense7:")}


def test_each_sense7_service_runs_a_command_the_multi_home_test_runs(compose):
    services = sense7_services(compose)
    assert set(services) == set(SERVICE_COMMANDS)
    for name, service in services.items():
        assert service["command"] == SERVICE_COMMANDS[name], name
    # Two rater-page instances: the multi-home test carries one session across two.
    assert services["rater-page"]["environment"] == services["rater-page-2"]["environment"]


# The kernel's CFS weight of nice 0..19 (kernel/sched/core.c, sched_prio_to_weight): the `cpu_shares` (Docker's
# default 1024 = nice 0) that gives a container the share `nice` gives a process on one machine.
CFS_WEIGHT = [1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15]


def test_background_services_yield_the_cpu_as_the_deployment_runs_them(compose):
    """Label Studio, the ML backend, the workers and beat get compose's `cpu_shares` of the niceness the
    deployment runs them at (SERVICE_NICE, LABEL_STUDIO_NICE); the raters' path (pages, proxy, PostgreSQL,
    Redis) keeps the default share."""
    services = compose["services"]
    for name, service in sense7_services(compose).items():
        assert service.get("cpu_shares", 1024) == CFS_WEIGHT[SERVICE_NICE[name]], name
    assert services["label-studio"]["cpu_shares"] == CFS_WEIGHT[LABEL_STUDIO_NICE] == BACKGROUND_CPU_SHARES
    assert BACKGROUND_CPU_SHARES < 1024
    for name in ("postgres", "redis", "haproxy", "rater-page", "rater-page-2"):
        assert "cpu_shares" not in services[name], name


def test_each_sense7_service_gets_the_settings_every_host_shares_alike(compose):
    services = sense7_services(compose)
    for name, service in services.items():
        env = service["environment"]
        missing = {*SHARED_SETTINGS, *SERVICE_SETTINGS[name], "SENSE7_HOME"} - set(env)
        assert not missing, f"{name}: {sorted(missing)} not set"
    for key in SHARED_SETTINGS:
        assert len({s["environment"][key] for s in services.values()}) == 1, f"{key} differs between services"


def test_no_two_services_share_a_writable_volume(compose):
    """Shared nothing but the settings: each home is its own volume (or the container's own files), and a
    scaled worker has no named volume its replicas would share."""
    owners: dict[str, list[str]] = {}
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, _, rest = volume.partition(":")
            if not rest.endswith(":ro"):
                owners.setdefault(source, []).append(name)
    shared = {source: names for source, names in owners.items() if len(names) > 1}
    assert not shared, f"writable volumes shared by several services: {shared}"
    assert "volumes" not in compose["services"]["worker"]  # `--scale worker=N`: N containers, one volume


def test_every_secret_is_required_from_the_environment(compose):
    """Each secret every host must agree on is `${VAR:?...}` (compose refuses to start without it), never
    written down or defaulted; so is the proxy's certificate file."""
    variable = re.compile(r"\$\{(\w+)(:?[-?+]?)")
    for name, service in sense7_services(compose).items():
        for key in SHARED_SECRETS:
            value = service["environment"][key]
            found = variable.findall(value)
            assert found, f"{name}: {key} is written in the file: {value!r}"
            assert all(op == ":?" for _, op in found), f"{name}: {key} is not required: {value!r}"
    for key in ("SENSE7_RATER_PAGE_SECRET", "SENSE7_WEBHOOK_SECRET", "SENSE7_BACKEND_PASSWORD", "SENSE7_LS_TOKEN"):
        value = compose["services"]["worker"]["environment"][key]
        assert value.startswith(f"${{{key}:?"), (key, value)
    assert compose["secrets"]["rater-page-tls"]["file"].startswith("${SENSE7_TLS_CERT_FILE:?")


def test_the_proxy_mounts_the_shipped_config_in_front_of_both_rater_pages(compose):
    services = compose["services"]
    proxy = services["haproxy"]
    assert PINNED.match(proxy["image"])
    mounts = [v for v in proxy["volumes"] if v.startswith(f"./{PROXY_CONFIG}:")]
    assert len(mounts) == 1 and mounts[0].endswith(":ro"), proxy["volumes"]
    target = mounts[0].split(":")[1]
    assert proxy["command"] == ["haproxy", "-f", target]
    env = proxy["environment"]
    needed = set(re.findall(r"\$\{(\w+)\}", (COMPOSE.parent / PROXY_CONFIG).read_text()))
    assert needed <= set(env), f"the config reads {sorted(needed - set(env))}, not set"
    assert {env["SENSE7_RATER_PAGE_ADDR"], env["SENSE7_RATER_PAGE_ADDR_2"]} == {
        f"{page}:{services[page]['environment']['SENSE7_RATER_PAGE_PORT']}" for page in ("rater-page", "rater-page-2")}
    # The certificate comes from a mounted file (a compose secret), not the image.
    assert env["SENSE7_TLS_CERT"] == f"/run/secrets/{proxy['secrets'][0]['target']}"
    assert proxy["secrets"][0]["source"] in compose["secrets"]
    # Published ports land on the binds the config listens on, on this machine only.
    inside = {env["SENSE7_PROXY_HTTPS_BIND"].rsplit(":", 1)[1], env["SENSE7_PROXY_HTTP_BIND"].rsplit(":", 1)[1]}
    assert {port.rsplit(":", 1)[1] for port in proxy["ports"]} == inside
    # The pages trust X-Forwarded-For from the proxy's fixed address only.
    proxy_ip = proxy["networks"]["default"]["ipv4_address"]
    for page in ("rater-page", "rater-page-2"):
        assert services[page]["environment"]["SENSE7_TRUSTED_PROXIES"] == proxy_ip
        assert set(services["haproxy"]["depends_on"]) >= {page}


def test_the_shipped_proxy_config_takes_a_second_rater_page(compose, tmp_path):
    """HAProxy itself reads the config with the compose file's two instances (names resolved here to
    127.0.0.1); the second `server` line is live: a bad second address is refused."""
    from sense7.processes import free_port

    haproxy = haproxy_binary()
    pem, _ = self_signed(tmp_path)
    env = {**compose["services"]["haproxy"]["environment"], "SENSE7_TLS_CERT": str(pem),
           "SENSE7_PROXY_HTTPS_BIND": f"127.0.0.1:{free_port()}", "SENSE7_PROXY_HTTP_BIND": f"127.0.0.1:{free_port()}"}
    for key in ("SENSE7_RATER_PAGE_ADDR", "SENSE7_RATER_PAGE_ADDR_2"):
        env[key] = "127.0.0.1:" + env[key].rsplit(":", 1)[1]

    def check(**changes) -> subprocess.CompletedProcess:
        return subprocess.run([haproxy, "-c", "-f", str(COMPOSE.parent / PROXY_CONFIG)], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", **env, **changes})

    both = check()
    assert both.returncode == 0, both.stdout + both.stderr
    one = {k: v for k, v in env.items() if k != "SENSE7_RATER_PAGE_ADDR_2"}
    alone = subprocess.run([haproxy, "-c", "-f", str(COMPOSE.parent / PROXY_CONFIG)], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", **one})
    assert alone.returncode == 0, alone.stdout + alone.stderr  # one instance, as the guide's single host runs it
    assert check(SENSE7_RATER_PAGE_ADDR_2="no-such-host.invalid:8090").returncode != 0


def test_label_studio_runs_several_worker_processes(compose):
    """The image ships uWSGI, not gunicorn: its `label-studio-uwsgi` mode, with SENSE7_LS_WORKERS processes."""
    ls = compose["services"]["label-studio"]
    assert ls["command"] == ["label-studio-uwsgi"]
    workers = re.fullmatch(r"\$\{SENSE7_LS_WORKERS:-(\d+)\}", ls["environment"]["UWSGI_PROCESSES"])
    assert workers and int(workers.group(1)) >= 2


def test_the_benchmarked_deployment_runs_the_compose_services_commands_and_settings(compose, tmp_path):
    """`scripts/bench_crowd.py --topology compose` measures on sense7.deployment.Deployment: every instance it
    starts is a compose sense7 service (the worker scaled to two), run by that service's command from the one list,
    in a home of its own, with the settings compose gives that service."""
    from sense7.deployment import Deployment

    services = sense7_services(compose)
    shared = {key: f"value-of-{key}" for key in SHARED_SETTINGS}
    deployment = Deployment(tmp_path / "hosts", shared, backend_bind="127.0.0.2:9999", workers=2)
    planned = [instance.service for instance in deployment.instances]
    assert sorted(set(planned)) == sorted(services) and planned.count("worker") == 2
    for instance in deployment.instances:
        assert instance.command == services[instance.service]["command"] == SERVICE_COMMANDS[instance.service]
        missing = {*SHARED_SETTINGS, *SERVICE_SETTINGS[instance.service], "SENSE7_HOME"} - set(instance.env)
        assert not missing, (instance.name, missing)
        assert {key: instance.env[key] for key in SHARED_SETTINGS} == shared
        assert instance.env["SENSE7_HOME"] == str(instance.home)
    homes = [instance.home for instance in deployment.instances]
    assert len(set(homes)) == len(homes) and not any(a in b.parents for a in homes for b in homes)
    backend = next(i for i in deployment.instances if i.service == "ml-backend")
    assert backend.env["SENSE7_BACKEND_ON_EVENT"] == services["ml-backend"]["environment"]["SENSE7_BACKEND_ON_EVENT"]
    for page in (i for i in deployment.instances if i.service.startswith("rater-page")):
        # Behind the proxy, as compose runs them: X-Forwarded-For believed from the proxy alone.
        assert page.env["SENSE7_TRUSTED_PROXIES"] == "127.0.0.1"
        assert page.env["SENSE7_RATER_PAGE_URL"] == deployment.proxy_url
    assert len(set(deployment.page_addresses())) == 2
