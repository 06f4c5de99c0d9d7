"""The console is Mailroom's own admin site (config.admin_site): its name, an index grouped by job with the
platform's internals for superusers only (and refused to everyone else by URL too), its own error pages and
landing page, one time format, and readable labels."""

import re
from datetime import UTC, datetime

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.template import loader
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import formats
from django.views import defaults

from config.admin_site import INTERNALS, OTHER, SECTION_OF, MailroomAdminSite, section_of
from reconciliation import times
from reconciliation.models import ReconciliationRun
from tests.factories import make_tenant
from tests.support.users import make_user
from ticketing.admin import ThreadLeaseAdmin
from ticketing.models import RoutingPolicy, ThreadLease

INTERNAL_MODELS = [m for m in admin.site._registry if section_of(m) == INTERNALS]


def console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def sections(html: str) -> list[str]:
    return re.findall(r'<section class="module console-section section-(\w+)"', html)


def links_in(html: str, section: str) -> list[str]:
    block = html.split(f'id="section-{section}"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'<th scope="row"[^>]*>\s*<a href="([^"]+)"', block)


# --- the site ---------------------------------------------------------------------------------------------


def test_the_default_admin_site_is_mailrooms_so_every_registration_lands_on_it():
    assert isinstance(admin.site._wrapped if hasattr(admin.site, "_wrapped") else admin.site, MailroomAdminSite)
    assert admin.site.site_header == "Mailroom" and admin.site.enable_nav_sidebar is False
    assert len(admin.site._registry) > 30  # the apps', auth's, axes' and celery beat's admins


def test_the_section_table_places_every_registered_model_and_names_no_model_that_is_not():
    registered = {(m._meta.app_label, m._meta.model_name) for m in admin.site._registry}
    assert sorted(registered - set(SECTION_OF)) == []  # a new model must be placed: it would fall in "Other"
    for app_label, model_name in SECTION_OF:  # and no stale row names a model that no longer exists
        assert apps.get_model(app_label, model_name)
    assert [m for m in admin.site._registry if section_of(m) == OTHER] == []


def test_the_console_says_mailroom_not_django_on_the_login_page_and_the_index(db):
    login = Client().get("/admin/login/").content.decode()
    index = console(make_user("root", is_superuser=True)).get("/admin/").content.decode()
    for page in (login, index):
        assert "Django" not in page
        assert '<div id="site-name"><a href="/admin/">' in page and "Mailroom" in page
        assert "reconciliation/console.css" in page and 'rel="icon"' in page
    assert "<title>Console | Mailroom</title>" in index
    assert 'id="nav-sidebar"' not in index  # the grouped index replaces the sidebar
    assert '<a href="/" id="start-page-link">Start page</a>' in index  # "View site" is the landing page


# --- the index by job ----------------------------------------------------------------------------------------


def test_a_superusers_index_has_the_four_sections_recovery_queue_first_and_the_dashboard_in_it(db):
    html = console(make_user("root", is_superuser=True)).get("/admin/").content.decode()
    assert sections(html) == ["recovery", "configuration", "evidence", "internals"]
    assert links_in(html, "recovery") == [
        reverse("admin:reconciliation_recoveryitem_changelist"),
        reverse("admin:reconciliation_dashboard"),
        reverse("admin:reconciliation_pauseswitch_changelist"),
        reverse("admin:reconciliation_bulkjob_changelist"),
    ]
    assert 'id="dashboard-link"' in html
    assert reverse("admin:axes_accessattempt_changelist") in links_in(html, "internals")
    assert reverse("admin:intake_outboxmessage_changelist") not in links_in(html, "evidence")
    configuration = links_in(html, "configuration")
    assert configuration[:3] == [
        reverse(f"admin:intake_{m}_changelist") for m in ("tenant", "verifieddomain", "mailbox")
    ]
    assert reverse("admin:auth_user_changelist") in configuration


def test_an_operator_sees_the_recovery_queue_and_a_tenant_admin_configuration_but_neither_the_internals(db):
    tenant = make_tenant("acme-site")
    operator = console(make_user("oper", groups=["operator"], tenants=[tenant])).get("/admin/").content.decode()
    assert sections(operator) == ["recovery", "configuration"]
    assert links_in(operator, "recovery") == [
        reverse("admin:reconciliation_recoveryitem_changelist"),
        reverse("admin:reconciliation_dashboard"),
        reverse("admin:reconciliation_bulkjob_changelist"),
    ]
    assert links_in(operator, "configuration") == [reverse("admin:reconciliation_apitoken_changelist")]  # their own
    tenant_admin = console(make_user("ada", groups=["mailroom-admin"], tenants=[tenant])).get("/admin/")
    html = tenant_admin.content.decode()
    assert sections(html) == ["recovery", "configuration", "evidence"]
    # Of the evidence, only their mailboxes' connection history (tokens, health, archive imports).
    assert links_in(html, "evidence") == [reverse("admin:intake_mailboxaudit_changelist")]
    # No queue permission, so no dashboard either.
    assert links_in(html, "recovery") == [reverse("admin:reconciliation_pauseswitch_changelist")]
    assert "Platform internals" not in html and "/admin/axes/" not in html


def test_a_user_holding_every_permission_but_not_a_superuser_gets_403_on_every_internal_model(db):
    internal_apps = {m._meta.app_label for m in INTERNAL_MODELS}
    everything = [
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.filter(content_type__app_label__in=internal_apps)
    ]
    client = console(make_user("almost-root", perms=everything))
    root = console(make_user("root", is_superuser=True))
    for model in INTERNAL_MODELS:
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        assert client.get(changelist).status_code == 403, opts.label
        assert root.get(changelist).status_code == 200, opts.label
        if admin.site._registry[model].has_add_permission(root.get("/admin/").wsgi_request):
            add = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
            assert client.get(add).status_code == 403, opts.label
    assert client.get("/admin/axes/").status_code == 404  # the app's own page has nothing for them
    assert client.get("/admin/django_celery_beat/").status_code == 404
    assert sections(client.get("/admin/").content.decode()) == ["configuration", "evidence"]


def test_the_internals_are_refused_on_an_object_url_too_not_only_hidden(db, tenant, mailbox):
    lease = ThreadLease.objects.create(
        mailbox=mailbox,
        thread_key="t" * 40,
        owner="worker:vm:24553",
        token=3,
        expires_at=datetime(2031, 1, 1, tzinfo=UTC),
    )
    url = reverse("admin:ticketing_threadlease_change", args=[lease.pk])
    client = console(make_user("lease-peeker", tenants=[tenant], perms=["ticketing.view_threadlease"]))
    response = client.get(url)
    assert response.status_code == 403 and 'id="error-403"' in response.content.decode()
    page = console(make_user("root", is_superuser=True)).get(reverse("admin:ticketing_threadlease_changelist"))
    assert "worker on vm, process 24553" in page.content.decode()
    assert ThreadLeaseAdmin.holder(None, ThreadLease(owner="vm:811")) == "worker on vm, process 811"
    assert ThreadLeaseAdmin.holder(None, ThreadLease(owner="beat")) == "beat"


# --- error pages and the landing page ------------------------------------------------------------------------


def test_an_unknown_console_url_is_mailrooms_404_with_the_way_back_to_the_console(db):
    response = console(make_user("root", is_superuser=True)).get("/admin/no-such-page/")
    html = response.content.decode()
    assert response.status_code == 404 and 'id="error-404"' in html
    assert '<a class="button-primary" id="back-to-console" href="/admin/">Back to the console</a>' in html
    assert "no-such-page" not in html and "reconciliation/console.css" in html
    outside = Client().get("/no-such-place/zqsecret")
    assert outside.status_code == 404 and "Open the console" in outside.content.decode()
    assert "zqsecret" not in outside.content.decode()  # the path is not echoed


def test_a_refusal_is_mailrooms_403_and_does_not_say_why(db):
    response = console(make_user("nobody")).get(reverse("admin:reconciliation_dashboard"))
    html = response.content.decode()
    assert response.status_code == 403 and 'id="error-403"' in html and "Back to the console" in html


def test_500_and_400_render_without_any_context_with_static_css_and_fixed_links(db):
    request = RequestFactory().get("/admin/")
    error = defaults.server_error(request)
    assert error.status_code == 500
    html = error.content.decode()
    assert 'id="error-500"' in html and 'href="/admin/"' in html and "/static/reconciliation/console.css" in html
    bad = defaults.bad_request(request, ValueError("bad header"))
    assert bad.status_code == 400 and 'id="error-400"' in bad.content.decode()
    assert "bad header" not in bad.content.decode()
    assert "{{" not in loader.get_template("500.html").render() and "{%" not in loader.get_template("400.html").render()


def test_the_landing_page_names_the_product_and_says_who_is_signed_in(db):
    anonymous = Client().get("/")
    html = anonymous.content.decode()
    assert anonymous.status_code == 200 and "<h1>Mailroom</h1>" in html
    assert '<a class="button-primary" id="open-console" href="/admin/">Open the console</a>' in html
    assert 'href="/api/docs/"' in html and 'href="/healthz"' in html and "signed in as" not in html
    signed_in = console(make_user("olga", groups=["operator"])).get("/").content.decode()
    assert "You are signed in as <strong>olga</strong>." in signed_in


# --- one time format, readable labels ------------------------------------------------------------------------


def test_djangos_own_date_display_is_the_consoles_format(db):
    moment = datetime(2026, 12, 1, 8, 51, 56, tzinfo=UTC)
    assert formats.date_format(moment, "DATETIME_FORMAT") == times.absolute(moment) == "2026-12-01 08:51 UTC"
    assert formats.date_format(moment, "SHORT_DATETIME_FORMAT") == "2026-12-01 08:51 UTC"
    assert formats.date_format(moment.date(), "DATE_FORMAT") == "2026-12-01"
    ReconciliationRun.objects.create(kind="unmapped", scope="site-test", started_at=moment, finished_at=moment)
    root = console(make_user("root", is_superuser=True))
    page = root.get(reverse("admin:reconciliation_reconciliationrun_changelist"))
    html = page.content.decode()
    assert "2026-12-01 08:51 UTC" in html and "a.m." not in html and "Dec. 1" not in html


def test_models_and_fields_read_as_words(db):
    tenant = make_tenant("demo")
    policy = RoutingPolicy.objects.get_or_create(tenant=tenant)[0]
    assert str(policy) == "Routing policy — demo"
    field = RoutingPolicy._meta.get_field
    assert field("ai_enabled").verbose_name == "AI proposals enabled"
    html = (
        console(make_user("root", is_superuser=True))
        .get(reverse("admin:ticketing_routingpolicy_change", args=[policy.pk]))
        .content.decode()
    )
    assert "AI proposals enabled" in html and "Ai enabled" not in html
    labels = {
        f"{m._meta.label}.{f.name}": str(f.verbose_name)
        for m in apps.get_models()
        if m._meta.app_label in ("intake", "ticketing")
        for f in m._meta.concrete_fields
    }
    # Django's default label for these would be "Base url", "Credentials ref", "Received at", ...
    assert labels["ticketing.Destination.base_url"] == "base URL"
    assert labels["intake.Mailbox.credentials_ref"] == "credentials reference"
    assert labels["intake.InboxEvent.received_at"] == "received"
    assert [name for name, label in labels.items() if label.endswith(" ref") or " ai " in f" {label} "] == []


@pytest.mark.parametrize(
    "owner, words", [("worker:vm:24553", "worker on vm, process 24553"), ("vm-2:77", "worker on vm-2, process 77")]
)
def test_lease_holders_read_as_words(owner, words):
    assert ThreadLeaseAdmin.holder(None, ThreadLease(owner=owner)) == words


def test_a_form_without_its_csrf_token_gets_mailrooms_page_and_nothing_changes(db):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("root", is_superuser=True))
    response = client.post(reverse("admin:intake_tenant_add"), {"slug": "csrf-less", "name": "x"})
    assert response.status_code == 403 and 'id="error-403-csrf"' in response.content.decode()
    assert not apps.get_model("intake", "Tenant").objects.filter(slug="csrf-less").exists()
