"""Every model of the three apps is in the admin, and every list page renders for a superuser."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from intake.keys import provider_message_id_for_raw
from intake.services import ingest
from tests.mail import make_message
from ticketing.services import process_inbox_event

MODELS = [m for m in apps.get_models() if m._meta.app_label in ("intake", "ticketing", "reconciliation")]


def _shown(model) -> bool:
    """Registered itself, or through a proxy of it (the pause switches are shown that way)."""
    return any(m is model or (m._meta.proxy and m._meta.concrete_model is model) for m in admin.site._registry)


def test_every_model_is_registered():
    assert [m._meta.label for m in MODELS if not _shown(m)] == []


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_list_and_detail_page_renders(client, mailbox, settings, model):
    if model not in admin.site._registry:
        model = next(m for m in admin.site._registry if m._meta.proxy and m._meta.concrete_model is model)
    settings.MAILROOM_CLAMD = "off"
    raw = make_message()
    event_id = ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    process_inbox_event(event_id)  # an event, intent, ticket, mapping and audit rows to show
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    client.force_login(user)
    opts = model._meta
    response = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert response.status_code == 200, opts.label
    first = model._default_manager.first()
    if first is not None:
        response = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[first.pk]))
        assert response.status_code == 200, opts.label
