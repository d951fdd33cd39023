"""Every write of console state goes through console/actions/, except the documented ones.

The scan reads the source (no imports run): an ORM write (`create`, `update`, `delete`, ...)
on a console model's manager, or SQL that inserts into, updates or deletes from a console
table, outside console/actions/ must be in EXCEPTIONS with the reason it is not a verb.
A new writer elsewhere fails here by file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("console", "ingest", "faultline")
WRITES = {
    "create",
    "bulk_create",
    "get_or_create",
    "update_or_create",
    "update",
    "bulk_update",
    "delete",
    "create_user",
    "create_superuser",
}
SQL_WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+console_\w+", re.IGNORECASE)

# file -> why its writes of console state are not console.actions verbs.
EXCEPTIONS = {
    # The measured hot path: each batch's live node, GPU and rank rows in raw SQL, in the
    # batch's transaction (docs/architecture.md, "The one write outside console.actions").
    "ingest/store/live_state.py": "live state upserts of the ingest hot path",
    # A group is made the first time an agent names it (idempotent, conflict-ignoring).
    "ingest/store/batch_state.py": "groups an agent names first, made in the batch",
    # The lookup's own bookkeeping: when a user token was last used, now and then.
    "console/tokens.py": "last_used_at of a token lookup",
    # The break-glass admin the first start makes, before any user exists to act.
    "faultline/bootstrap.py": "the first admin, before anyone can act",
    # The SSO library's user, made at first sign-in; its role and audit row follow in
    # console.actions.record_sso_sign_in within the same request.
    "faultline/sso.py": "the SSO identity row of a first sign-in",
}


def _console_models() -> set[str]:
    return {model.__name__ for model in apps.get_app_config("console").get_models()} | {
        "User",
        "user_model",
    }


def _base_name(node: ast.AST) -> str | None:
    """The name an attribute chain starts from: `Node.objects.filter(...).update` -> Node."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _through_manager(node: ast.AST) -> bool:
    while isinstance(node, ast.Attribute | ast.Call):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            return True
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return False


def writers(source: str, models: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            manager_model = _base_name(node.func.value)
            if (
                node.func.attr in WRITES
                and _through_manager(node.func.value)
                and manager_model in models
            ):
                found.append((node.lineno, f"{manager_model}.objects...{node.func.attr}()"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = SQL_WRITE.search(node.value)
            if match:
                found.append((node.lineno, " ".join(match.group(0).split())))
    return found


def _scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel.startswith("console/actions/"):
                continue
            files.append(path)
    return files


def test_console_state_is_written_only_by_console_actions() -> None:
    models = _console_models()
    outside = {}
    for path in _scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        found = writers(path.read_text(), models)
        if found and rel not in EXCEPTIONS:
            outside[rel] = found
    assert outside == {}, "console state written outside console/actions/: " + "; ".join(
        f"{rel}:{line} {what}" for rel, rows in outside.items() for line, what in rows
    )


def test_every_exception_still_writes() -> None:
    """An exception whose file no longer writes is removed, so the list stays the truth."""
    models = _console_models()
    stale = [rel for rel in EXCEPTIONS if not writers((ROOT / rel).read_text(), models)]
    assert stale == []


@pytest.mark.parametrize(
    "source",
    [
        "Node.objects.create(name='x')",
        "Incident.objects.filter(pk=1).update(state='resolved')",
        "Device.objects.select_for_update().get(pk=1).delete()"
        if False
        else "Device.objects.filter(pk=1).delete()",
        "AuditLog.objects.bulk_create(rows)",
        "Membership.objects.update_or_create(user=u, defaults={})",
        "cursor.execute('UPDATE console_node SET health = %s', [h])",
        "cursor.execute('''insert into\\n console_incident (id) values (1)''')",
        "SQL = 'DELETE FROM console_action WHERE id = 1'",
    ],
)
def test_the_scan_sees_each_form_of_write(source: str) -> None:
    assert writers(source, _console_models()), source


@pytest.mark.parametrize(
    "source",
    [
        "Node.objects.filter(name='x').exists()",
        "AgentCredential.objects.create(node=n)",  # ingest's own table
        "cursor.execute('SELECT * FROM console_node')",
        "x = 'update the console_node card'",
    ],
)
def test_reads_and_ingest_tables_are_not_writes(source: str) -> None:
    assert writers(source, _console_models()) == [], source
