"""Configuring each destination kind in the admin: its settings checked field by field, and the
"test connection" action, which proves credentials against the kind's fake and writes nothing."""

import importlib
import json

import pytest
from django.contrib.messages import get_messages

from tests.destination_kits import KINDS
from ticketing.destination_admin import DestinationForm
from ticketing.destinations import adapter_class
from ticketing.models import Destination

CHANGELIST = "/admin/ticketing/destination/"


@pytest.fixture(params=KINDS)
def configured(request, tenant, desk_factory, monkeypatch):
    """(kit, desk, destination): a destination of each kind against its running fake."""
    kit = importlib.import_module(f"tests.destination_kits.{request.param}")
    desk = desk_factory(dialect=kit.DIALECT, **kit.DESK_OPTIONS)
    return kit, desk, kit.configure(tenant, desk, monkeypatch)


def form_for(destination, **changes):
    data = {
        "tenant": destination.tenant_id,
        "slug": destination.slug,
        "kind": destination.kind,
        "base_url": destination.base_url,
        "credentials_ref": destination.credentials_ref,
        "settings": destination.settings,
        "is_default": "",
        "paused": "",
    }
    data.update(changes)
    data["settings"] = json.dumps(data["settings"])
    return DestinationForm(data={k: v for k, v in data.items() if v != ""})


def test_each_kinds_working_settings_pass_and_bad_ones_are_named_field_by_field(configured):
    _, _, destination = configured
    assert form_for(destination, slug="copy").is_valid(), form_for(destination, slug="copy").errors
    bad = {**destination.settings, "read_timeout": "soon", "max_attempts": 0, "no_such_setting": 1}
    form = form_for(destination, slug="copy", settings=bad)
    assert not form.is_valid()
    problems = form.errors["settings"]
    assert "read_timeout: must be a number" in problems
    assert "max_attempts: must be at least 1" in problems
    assert any(p.startswith("no_such_setting: is not a setting of this kind") for p in problems)


def test_a_kind_that_needs_a_url_and_credentials_says_so(configured):
    _, _, destination = configured
    adapter = adapter_class(destination.kind)
    form = form_for(destination, slug="copy", base_url="", credentials_ref="")
    assert form.is_valid() is not (adapter.needs_base_url or adapter.needs_credentials)
    assert ("This kind needs its base URL." in str(form.errors.get("base_url"))) is adapter.needs_base_url
    assert ("needs credentials" in str(form.errors.get("credentials_ref"))) is adapter.needs_credentials
    # Only the generic REST kind may do without: every URL of it may be absolute, an internal API may be open.
    assert (adapter.needs_base_url, adapter.needs_credentials) == (
        (False, False) if destination.kind == "rest" else (True, True)
    )


def test_test_connection_in_the_admin_proves_credentials_and_writes_nothing(configured, admin_client, monkeypatch):
    _, desk, destination = configured
    response = admin_client.post(
        CHANGELIST, {"action": "test_connection", "_selected_action": [destination.pk]}, follow=True
    )
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert len(said) == 1 and said[0].startswith(f"{destination}: OK, "), said
    assert desk.tickets() == [] and desk.requests_log() == []

    monkeypatch.setenv("WRONG_CREDENTIALS", "nobody:wrong-secret")
    Destination.objects.filter(pk=destination.pk).update(credentials_ref="env:WRONG_CREDENTIALS")
    response = admin_client.post(
        CHANGELIST, {"action": "test_connection", "_selected_action": [destination.pk]}, follow=True
    )
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert len(said) == 1 and said[0].startswith(f"{destination}: failed (permanent: "), said
    assert desk.tickets() == [] and desk.requests_log() == []
    assert Destination.objects.get(pk=destination.pk).paused is False  # a test is not a failure the breaker counts


def test_the_builtin_store_needs_neither_url_nor_credentials(mailbox):
    destination = Destination.objects.get(tenant=mailbox.tenant, slug="builtin")
    form = form_for(destination, slug="store-2", settings={"sla_hours": 24})
    assert form.is_valid(), form.errors
    form = form_for(destination, slug="store-3", settings={"read_timeout": 3})
    assert "read_timeout: is not a setting of this kind" in str(form.errors["settings"])


@pytest.mark.parametrize("status", [400, 401, 404, 422, 500])
def test_test_connection_names_the_status_never_the_answer_s_body(configured, admin_client, status):
    """Finding 4's read channel: an error body (an internal service's answer) was echoed in the admin."""
    _, desk, destination = configured
    leak = "INTERNAL-ONLY aws_secret_access_key=wJalrXUtnFEMI"
    desk.on_request(
        lambda request: (status, {"error": leak, "errors": [{"message": leak}], "details": leak, "message": leak})
    )
    response = admin_client.post(
        CHANGELIST, {"action": "test_connection", "_selected_action": [destination.pk]}, follow=True
    )
    [said] = [str(m) for m in get_messages(response.wsgi_request)]
    assert said.startswith(f"{destination}: failed ("), said
    # The status, or (a 404 some kinds explain in their own words: "service desk 1 does not exist") our text.
    assert f"the destination answered HTTP {status}" in said or (status == 404 and "HTTP" not in said), said
    assert "INTERNAL-ONLY" not in said and "wJalrXUtnFEMI" not in said
    assert desk.tickets() == []
