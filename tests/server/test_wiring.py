"""Wiring a user relies on: env settings fail loudly, health endpoints, deployment files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultline.env import ConfigError, database_from_url, env_bool, env_int, env_secret

ROOT = Path(__file__).resolve().parents[2]


def test_it_refuses_a_boolean_typo(monkeypatch):
    monkeypatch.setenv("FAULTLINE_X", "ture")
    with pytest.raises(ConfigError, match="FAULTLINE_X='ture' is not a boolean"):
        env_bool("FAULTLINE_X")


def test_it_refuses_a_non_integer_and_a_value_below_minimum(monkeypatch):
    monkeypatch.setenv("FAULTLINE_N", "ten")
    with pytest.raises(ConfigError, match="not an integer"):
        env_int("FAULTLINE_N", 1)
    monkeypatch.setenv("FAULTLINE_N", "0")
    with pytest.raises(ConfigError, match="below the minimum 1"):
        env_int("FAULTLINE_N", 5, minimum=1)


def test_it_reads_secrets_from_a_file(monkeypatch, tmp_path):
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("FAULTLINE_K_FILE", str(secret))
    assert env_secret("FAULTLINE_K") == "s3cret"


def test_it_parses_socket_and_tcp_database_urls():
    sock = database_from_url("postgresql://postgres:@/faultline?host=/tmp/pg")
    assert (sock["NAME"], sock["HOST"], sock["USER"]) == ("faultline", "/tmp/pg", "postgres")
    tcp = database_from_url("postgres://u:p%40ss@db:5433/fl")
    assert (tcp["HOST"], tcp["PORT"], tcp["PASSWORD"]) == ("db", "5433", "p@ss")
    with pytest.raises(ConfigError, match="postgres://"):
        database_from_url("mysql://x/y")


@pytest.mark.parametrize(
    ("netloc", "host", "port"),
    [
        ("u:pw@db1:5432,db2:5433", "db1,db2", "5432,5433"),
        ("u:pw@db1,db2", "db1,db2", ""),
        ("u:pw@db1:6432,db2", "db1,db2", "6432,5432"),
        ("u:pw@[::1]:5432,db2:5433", "::1,db2", "5432,5433"),
        ("u:pw@db1:5432", "db1", "5432"),
    ],
)
def test_it_parses_a_primary_and_standby_database_url(netloc, host, port):
    db = database_from_url(f"postgres://{netloc}/fl?target_session_attrs=read-write")
    assert (db["HOST"], db["PORT"], db["USER"], db["PASSWORD"]) == (host, port, "u", "pw")
    assert db["OPTIONS"] == {"target_session_attrs": "read-write"}


def test_it_refuses_a_port_that_is_not_a_number():
    with pytest.raises(ConfigError, match="port 'x'"):
        database_from_url("postgres://u@db1:x,db2/fl")


@pytest.mark.django_db
def test_it_reports_liveness_and_readiness_without_secrets(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "ready": True,
        "checks": {"database": True, "migrations": True, "broker": True, "database_writes": True},
    }


@pytest.mark.django_db
def test_readiness_sees_a_migration_unapplied_after_it_was_ready(client):
    """The probe remembers a finished plan only while the applied count stays the same."""
    from django.db import connection

    assert client.get("/readyz").json()["checks"]["migrations"] is True
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE id = (SELECT max(id) FROM django_migrations)"
        )
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"] == {
        "database": True, "migrations": False, "broker": True, "database_writes": True
    }  # fmt: skip


def test_it_ships_a_compose_file_with_every_role_and_healthchecks():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    roles = {"web", "ws", "worker", "worker-urgent", "worker-housekeeping", "worker-notify",
             "beat"}  # fmt: skip
    assert {"postgres", "redis", *roles} <= set(services)
    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"] == "redis:7"
    for name in ("postgres", "redis", "web", "ws", "worker", "worker-urgent",
                 "worker-housekeeping", "worker-notify"):  # fmt: skip
        assert "healthcheck" in services[name], name
    for name in sorted(roles):
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"].startswith("redis://")
        assert "${FAULTLINE_SECRET_KEY:?" in env["FAULTLINE_SECRET_KEY"]  # never in git
    # Two beats behind the leader lock (faultline.beat): one dying leaves the sweeps running.
    assert services["beat"]["deploy"]["replicas"] >= 2
    assert "volumes" not in services["beat"]  # each replica its own schedule file
    assert (ROOT / "Dockerfile").exists()


@pytest.mark.django_db
def test_it_has_no_missing_migrations():
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/devices/?node=n%00",
        "/api/v1/incidents/?group=g%00",
        "/api/v1/alerts/?group=g%00",
        "/api/v1/groups/g%00/",
        "/api/v1/groups/g%00/slo/",
        "/api/v1/nodes/?n%00=1",
    ],
)
def test_it_refuses_nul_in_api_filters_and_paths(client, cast, url):
    """Found by the schema fuzz: NUL in a filter or path reached Postgres and was a 500."""
    client.force_login(cast["viewer"])
    response = client.get(url)
    assert response.status_code == 400
    assert response.json() == {
        "error": "NUL (0x00) characters are not allowed in the path or query string"
    }


TASK_MODULES = {"console.tasks", "console.notify_tasks", "ingest.tasks"}


def _imports(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_it_imports_no_tasks_module_outside_celery_autodiscovery():
    """Tasks are enqueued by name (console.scheduling), so no import cycle runs through them."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & TASK_MODULES)
        for package in ("console", "ingest", "faultline")
        for path in (ROOT / package).rglob("*.py")
        if _imports(path) & TASK_MODULES
    }
    assert offenders == {}


def test_it_schedules_only_tasks_that_autodiscovery_registers():
    from console import scheduling
    from faultline.celery import app

    app.loader.import_default_modules()
    names = {entry["task"] for entry in app.conf.beat_schedule.values()}
    names |= {scheduling.DIAGNOSE_GROUP, scheduling.DIAGNOSE_GROUPS, scheduling.CHECK_GROUP,
              scheduling.SEND_NOTIFICATION}  # fmt: skip
    assert names - set(app.tasks) == set()
    assert {"console.rollup_step_bins", "console.maintain_telemetry",
            "console.measure_recovery_costs", "ingest.analyze_partitions"} <= names  # fmt: skip


@pytest.mark.django_db
def test_it_shows_audited_models_read_only_in_the_admin_and_hides_api_tokens(client, cast):
    from console.models import ConsistencyGroup, Incident, Node

    group = ConsistencyGroup.objects.create(name="job")
    node = Node.objects.create(name="n-1")
    incident = Incident.objects.create(
        group=group, fingerprint="fp", kind="xid", subject="gpu:GPU-1", severity="critical",
        summary="Xid 79", opened_at="2026-11-29T10:00:00Z",
    )  # fmt: skip
    client.force_login(cast["admin"])
    assert client.get(f"/admin/console/incident/{incident.pk}/change/").status_code == 200
    refused = client.post(
        f"/admin/console/incident/{incident.pk}/change/", {"state": "resolved", "summary": "x"}
    )
    assert refused.status_code == 403
    assert client.post(f"/admin/console/node/{node.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/console/consistencygroup/add/").status_code == 403
    incident.refresh_from_db()
    assert (incident.state, Node.objects.filter(pk=node.pk).exists()) == ("open", True)
    assert client.get("/admin/authtoken/tokenproxy/").status_code == 404
    assert client.get("/admin/console/membership/").status_code == 200
