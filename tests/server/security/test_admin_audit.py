"""The admin site: every edit of a user or a role writes an audit row naming the admin (the
same transaction), roles and the staff/superuser flags move together, nothing else there
can be changed, and the first admin's password passes the validators."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model

from console.models import AuditLog, Membership
from console.roles import role_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def site(client: Any, cast: Any) -> Any:
    client.force_login(cast["admin"])
    return client


def _rows(verb: str) -> list[AuditLog]:
    return list(AuditLog.objects.filter(verb=verb).order_by("id"))


def _change_form(user: Any, **changes: Any) -> dict[str, Any]:
    form = {"username": user.username, "first_name": user.first_name,
            "last_name": user.last_name, "email": user.email,
            "is_active": "on" if user.is_active else "",
            "date_joined_0": "2026-12-01", "date_joined_1": "10:00:00"}  # fmt: skip
    form.update(changes)
    return {k: v for k, v in form.items() if v != ""}


def test_deactivating_a_user_is_audited_with_the_admins_name(site: Any, cast: Any) -> None:
    viewer = cast["viewer"]
    response = site.post(f"/admin/auth/user/{viewer.pk}/change/",
                         _change_form(viewer, is_active="", email="v@example.test"))  # fmt: skip
    assert response.status_code == 302, response.content[:500]
    viewer.refresh_from_db()
    assert viewer.is_active is False
    (row,) = _rows("user.changed")
    assert (row.actor, row.object_id) == ("admin", str(viewer.pk))
    assert row.data["fields"] == ["email", "is_active"]
    assert row.data["values"] == {"email": "v@example.test", "is_active": False}


def test_the_superuser_flag_cannot_be_set_from_the_user_form(site: Any, cast: Any) -> None:
    viewer = cast["viewer"]
    site.post(f"/admin/auth/user/{viewer.pk}/change/",
              _change_form(viewer, is_superuser="on", is_staff="on"))  # fmt: skip
    viewer.refresh_from_db()
    assert (viewer.is_superuser, viewer.is_staff, role_of(viewer)) == (False, False, "viewer")


@pytest.mark.parametrize(("start", "to", "superuser"), [("viewer", "approver", False),
                                                      ("viewer", "admin", True),
                                                      ("approver", "operator", False)])  # fmt: skip
def test_a_role_change_is_audited_and_moves_the_flags_with_it(
    site: Any, cast: Any, start: str, to: str, superuser: bool
) -> None:
    user = cast[start]
    membership = Membership.objects.get(user=user)
    response = site.post(f"/admin/console/membership/{membership.pk}/change/", {"role": to})
    assert response.status_code == 302, response.content[:500]
    user = get_user_model().objects.get(pk=user.pk)
    assert (role_of(user), user.is_superuser, user.is_staff) == (to, superuser, superuser)
    (row,) = _rows("user.role")
    assert (row.actor, row.data) == ("admin", {"before": start, "after": to})


def test_demoting_an_admin_is_audited_and_the_last_admin_keeps_the_role(
    site: Any, cast: Any
) -> None:
    admin_user = cast["admin"]
    membership = Membership.objects.get(user=admin_user)
    response = site.post(f"/admin/console/membership/{membership.pk}/change/",
                         {"role": "viewer"})  # fmt: skip
    assert response.status_code in (200, 403, 302)
    admin_user.refresh_from_db()
    assert admin_user.is_superuser and role_of(admin_user) == "admin"
    assert _rows("user.role") == []


def test_setting_a_password_is_audited_without_the_password(site: Any, cast: Any) -> None:
    viewer = cast["viewer"]
    secret = "a-new-long-passphrase-77"
    response = site.post(f"/admin/auth/user/{viewer.pk}/password/",
                         {"password1": secret, "password2": secret,
                          "usable_password": "true", "set-password": "1"})  # fmt: skip
    assert response.status_code == 302, response.content[:800]
    viewer.refresh_from_db()
    assert viewer.check_password(secret)
    (row,) = _rows("user.password_changed")
    assert row.actor == "admin" and row.data == {"usable": True}
    dumped = str(AuditLog.objects.values_list("data", "reason"))
    assert secret not in dumped and viewer.password not in dumped


def test_a_weak_password_is_refused_in_the_admin_too(site: Any, cast: Any) -> None:
    viewer = cast["viewer"]
    before = viewer.password
    weak = {"password1": "password1", "password2": "password1", "usable_password": "true"}
    site.post(f"/admin/auth/user/{viewer.pk}/password/", weak)
    viewer.refresh_from_db()
    assert viewer.password == before and _rows("user.password_changed") == []


def test_adding_and_deleting_a_user_are_audited(site: Any) -> None:
    secret = "a-long-enough-passphrase-1"
    response = site.post("/admin/auth/user/add/", {"username": "newbie", "usable_password": "true",
                         "password1": secret, "password2": secret})  # fmt: skip
    assert response.status_code == 302, response.content[:800]
    newbie = get_user_model().objects.get(username="newbie")
    assert role_of(newbie) == "viewer"
    (created,) = [row for row in _rows("user.created") if row.object_id == str(newbie.pk)]
    assert created.actor == "admin" and created.data["fields"] == ["username"]
    response = site.post(f"/admin/auth/user/{newbie.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not get_user_model().objects.filter(username="newbie").exists()
    (deleted,) = _rows("user.deleted")
    assert (deleted.actor, deleted.data["username"]) == ("admin", "newbie")


def test_every_model_in_the_admin_is_read_only_or_saved_through_the_audited_path(
    rf: Any, cast: Any
) -> None:
    """The space: a model added to the admin later cannot slip past the audit log."""
    from console.admin import AuditedUserAdmin, MembershipAdmin

    request = rf.get("/admin/")
    request.user = cast["admin"]
    audited = (AuditedUserAdmin, MembershipAdmin)
    for model, model_admin in admin.site._registry.items():
        if isinstance(model_admin, audited):
            continue
        writable = [
            name for name, allowed in (
                ("add", model_admin.has_add_permission(request)),
                ("change", model_admin.has_change_permission(request)),
                ("delete", model_admin.has_delete_permission(request)),
            ) if allowed
        ]  # fmt: skip
        assert writable == [], f"{model.__name__} can be {writable} in the admin unaudited"


# -- the first admin's password ---------------------------------------------------------------


@pytest.mark.parametrize("weak", ["short", "password123", "12345678901", "qwertyuiop"])
def test_a_weak_first_admin_password_stops_startup_and_creates_nobody(
    monkeypatch: pytest.MonkeyPatch, weak: str
) -> None:
    from faultline.bootstrap import BootstrapError, ensure_admin

    monkeypatch.setenv("FAULTLINE_ADMIN_USER", "root")
    monkeypatch.setenv("FAULTLINE_ADMIN_PASSWORD", weak)
    with pytest.raises(BootstrapError, match="FAULTLINE_ADMIN_PASSWORD is refused for root"):
        ensure_admin()
    assert not get_user_model().objects.filter(username="root").exists()


def test_a_strong_first_admin_password_creates_the_admin(monkeypatch: pytest.MonkeyPatch) -> None:
    from faultline.bootstrap import ensure_admin

    monkeypatch.setenv("FAULTLINE_ADMIN_USER", "root")
    monkeypatch.setenv("FAULTLINE_ADMIN_PASSWORD", "a-long-root-passphrase-9")
    login = ensure_admin()
    assert login is not None and not login.generated
    assert get_user_model().objects.get(username="root").check_password("a-long-root-passphrase-9")
