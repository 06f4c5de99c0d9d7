"""Tenant isolation, crawled: tenant B's users walk every admin page and every API route and must never see
or change tenant A's rows (docs/design.md §7; issue item 7).

Two tenants are seeded alike (mailbox, destinations, events completed / awaiting_review / quarantined /
failed, intents, a mapping and ticket, a routing policy and rule, a reconciliation run and finding). Every
string of A's carries the marker `zqalpha` (B's: `zqbeta`), so a leak is A's marker in a response seen by a
B user, A's id in an API list, a 200 on one of A's objects, or a change to A's rows or to the row counts
after a refused write. `crawl()` returns the leaks; the last test breaks one admin and one API view on
purpose and shows the crawl reports them.
"""

import re
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from intake.admin import InboxEventAdmin
from intake.models import InboxEvent
from reconciliation.admin.queue import RecoveryItemAdmin
from reconciliation.api import urls as api_urls
from reconciliation.api.views import MappingViewSet
from reconciliation.models import Finding, ReconciliationRun
from tests.conftest import WEBHOOK_SECRET
from tests.factories import WEBHOOK_SECRET_VAR, make_destination, make_mailbox, make_tenant
from tests.support.api import api, failed_item, review_item
from tests.support.queue import new_event, quarantine
from tests.support.users import make_user
from ticketing.models import AcknowledgmentTemplate, BusinessHours, RoutingPolicy, RoutingRule, TicketMapping
from ticketing.services import process_inbox_event

A, B = "zqalpha", "zqbeta"
APPS = ("intake", "ticketing", "reconciliation")
APP_MODELS = [m for m in apps.get_models() if m._meta.app_label in APPS]
REFUSED = {401, 403, 404, 405}
ROUTED = ("correct", "replay_new", "confirm")  # the queue actions that take a destination
# Search terms that match A's rows (icontains) without being A's marker, which the search box echoes.
SEARCHES = ("alpha", "printer", "support")


def seed_tenant(marker: str) -> None:
    tenant = make_tenant(slug=marker, name=f"{marker} Inc")
    RoutingPolicy.objects.update_or_create(
        tenant=tenant, defaults={"queues": [f"{marker}-queue"], "request_types": [f"{marker}-type"]}
    )
    desk = make_destination(tenant, slug=f"{marker}-desk")
    spare = make_destination(tenant, slug=f"{marker}-spare", is_default=False)
    mailbox = make_mailbox(tenant, slug=f"{marker}-support", address=f"support@{marker}.test")
    RoutingRule.objects.create(
        tenant=tenant,
        mailbox=mailbox,
        name=f"{marker}-rule",
        destination=spare,
        conditions={"subject_regex": f"^{marker} escalation"},
        queue=f"{marker}-queue",
    )
    sender = f"customer@{marker}.test"
    done = new_event(mailbox, subject=f"{marker} printer on fire", sender=sender)
    process_inbox_event(done)
    assert InboxEvent.objects.get(pk=done).state == "completed"
    assert TicketMapping.objects.filter(inbox_event_id=done).exists()
    review = review_item(mailbox, subject=f"{marker} printer needs review", sender=sender)
    quarantined = new_event(mailbox, subject=f"{marker} printer invoice", sender=sender)
    quarantine(quarantined)
    failed_item(mailbox, desk, subject=f"{marker} printer rejected", sender=sender)
    now = timezone.now()
    run = ReconciliationRun.objects.create(
        kind="unmapped", scope=mailbox.slug, started_at=now, finished_at=now, scanned=4, findings=1
    )
    Finding.objects.create(
        run=run,
        kind="unmapped",
        object=f"event:{review}",
        tenant=tenant,
        inbox_event_id=review,
        detail={"marker": marker},
        first_seen=now,
        last_seen=now,
    )
    AcknowledgmentTemplate.objects.create(
        tenant=tenant,
        mailbox=mailbox,
        language="de",
        subject=f"{marker} Ihre Anfrage {{{{ ticket_number }}}}",
        body=f"{marker}\n",
    )
    BusinessHours.objects.create(
        tenant=tenant,
        mailbox=mailbox,
        timezone="Europe/Berlin",
        response_hours=8,
        weekly={"mon": [["09:00", "17:00"]]},
        holidays_country="DE",
    )
    make_user(f"{marker}-operator", groups=["operator"], tenants=[tenant])


def all_pks() -> dict:
    return {m: set(m._default_manager.values_list("pk", flat=True)) for m in APP_MODELS}


def counts() -> dict:
    return {label: count for label, (count, _) in fingerprint({}).items()}


def values_of(owned: dict) -> dict:
    return {label: digest for label, (_, digest) in fingerprint(owned).items() if digest}


def fingerprint(owned: dict) -> dict:
    """{table: (row count, digest of the rows of `owned`)} in one query."""
    tables = {m._meta.db_table: m for m in APP_MODELS if not m._meta.proxy}
    selects, params = [], []
    for table, model in tables.items():
        pk = connection.ops.quote_name(model._meta.pk.column)
        selects.append(f'(SELECT count(*) FROM "{table}")')
        selects.append(
            f"(SELECT md5(string_agg(t::text, ',' ORDER BY t.{pk})) FROM \"{table}\" t WHERE t.{pk} = ANY(%s))"
        )
        params.append(sorted(owned.get(model, ())))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(selects)}", params)
        row = cursor.fetchone()
    return {table: (row[2 * i], row[2 * i + 1]) for i, table in enumerate(tables)}


def owned_by(model, owned: dict) -> set:
    return owned.get(model._meta.concrete_model, set())


@pytest.fixture
def two_tenants(db, settings, monkeypatch):
    """(A's rows as {model: pks}, B's users by role)."""
    settings.MAILROOM_CLAMD = "off"
    monkeypatch.setenv(WEBHOOK_SECRET_VAR, WEBHOOK_SECRET)
    before = all_pks()
    seed_tenant(A)
    after_a = all_pks()
    owned = {m: after_a[m] - before[m] for m in APP_MODELS}
    seed_tenant(B)
    tenant_b = InboxEvent.objects.filter(subject__startswith=B).first().tenant
    every_perm = Permission.objects.filter(content_type__app_label__in=APPS)
    users = {
        "operator": make_user(f"{B}-op", groups=["operator"], tenants=[tenant_b]),
        "security": make_user(f"{B}-sec", groups=["security"], tenants=[tenant_b]),
        "mailroom-admin": make_user(f"{B}-adm", groups=["mailroom-admin"], tenants=[tenant_b]),
        "staff": make_user(f"{B}-staff", tenants=[tenant_b]),
        # Every role and every permission of the three apps, not a superuser: only tenant scoping stands in the way.
        "everything": make_user(
            f"{B}-all",
            groups=["operator", "security", "mailroom-admin"],
            tenants=[tenant_b],
            perms=[f"{p.content_type.app_label}.{p.codename}" for p in every_perm],
        ),
    }
    return owned, users


# --- the crawl -------------------------------------------------------------------------------------------------


class Crawl:
    def __init__(self, owned: dict, user):
        self.owned, self.user, self.leaks = owned, user, []
        self.admin = Client()
        self.admin.force_login(user)
        self.api = api(user)
        self.a_values = values_of(owned)

    def leak(self, what: str) -> None:
        self.leaks.append(f"{self.user.get_username()}: {what}")

    def check_page(self, method: str, url: str, response, *, refused_only=False) -> None:
        """A 5xx, A's marker in the body, or (on one of A's objects) anything but a refusal. A GET may also be
        redirected (the admin's "does not exist" redirect to its index, or to the login page)."""
        # A write naming A's tenant is answered "Object with slug=zqalpha does not exist.": our input, echoed.
        body = response.content.decode(errors="replace").replace(f"slug={A} ", "")
        allowed = REFUSED | ({302} if method == "GET" else set())
        if response.status_code >= 500:
            self.leak(f"{method} {url} -> {response.status_code}")
        if A in body.lower():
            self.leak(f"{method} {url} -> {response.status_code} shows {A!r}")
        elif refused_only and response.status_code not in allowed:
            self.leak(f"{method} {url} -> {response.status_code} on one of A's objects")

    def check_write(self, what: str, counts_before: dict) -> None:
        after = counts()
        if after != counts_before:
            changed = {k: (v, after[k]) for k, v in counts_before.items() if after[k] != v}
            self.leak(f"{what} changed row counts {changed}")
        now = values_of(self.owned)
        if now != self.a_values:
            changed = sorted(label for label in {*now, *self.a_values} if now.get(label) != self.a_values.get(label))
            self.leak(f"{what} changed A's rows in {changed}")
            self.a_values = now

    # admin
    def admin_lists(self) -> None:
        for model, model_admin in admin.site._registry.items():
            opts = model._meta
            url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            queries = [{}] + [{"q": term} for term in SEARCHES] + self.filter_queries(model, model_admin)
            for query in queries:
                self.check_page("GET", f"{url}?{urlencode(query)}", self.admin.get(url, query))

    def filter_queries(self, model, model_admin) -> list[dict]:
        """One query per list filter, set to a value of A's rows (an A tenant, mailbox, state, ...)."""
        queries, a_rows = [], model._default_manager.filter(pk__in=owned_by(model, self.owned))
        for spec in model_admin.list_filter:
            if isinstance(spec, type) and issubclass(spec, admin.SimpleListFilter):
                queries += [{spec.parameter_name: value} for value in ("yes", "no")]
                continue
            name = spec[0] if isinstance(spec, tuple) else spec
            field = model._meta.get_field(name)
            if field.is_relation:
                values = {pk for pk in a_rows.values_list(f"{name}__pk", flat=True) if pk is not None}
                values |= owned_by(field.related_model, self.owned) if not values else set()
                queries += [{f"{name}__id__exact": pk} for pk in sorted(values)[:3]]
            else:
                values = {v for v in a_rows.values_list(name, flat=True) if v not in (None, "")}
                queries += [{f"{name}__exact": v} for v in sorted(values, key=str)[:3]]
        return queries

    def admin_objects(self) -> None:
        for model in admin.site._registry:
            opts = model._meta
            for pk in sorted(owned_by(model, self.owned)):
                for view in ("change", "history", "delete"):
                    try:
                        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[pk])
                    except NoReverseMatch:
                        continue
                    self.check_page("GET", url, self.admin.get(url), refused_only=True)
        for pk in sorted(self.owned[InboxEvent]):
            for url in (
                reverse("admin:reconciliation_recoveryitem_body", args=[pk]),
                reverse("admin:reconciliation_recoveryitem_attachment", args=[pk, 0]),
            ):
                self.check_page("GET", url, self.admin.get(url), refused_only=True)

    def admin_writes(self, own_destination) -> None:
        own = {
            "assignee": self.user.pk,
            "escalate_at": "2031-01-01 10:00",
            "reason": "crawl",
            "note": "crawl",
            "ticket_id": "T-1",
            "ticket_url": "",
            "queue": "",
            "priority": "",
            "request_type": "",
        }
        a_destination = min(owned_by(apps.get_model("ticketing", "Destination"), self.owned))
        for pk in sorted(self.owned[InboxEvent]):
            for action in RecoveryItemAdmin.ACTIONS:
                for destination in (a_destination, own_destination) if action in ROUTED else (own_destination,):
                    url = reverse("admin:reconciliation_recoveryitem_act", args=[pk, action])
                    before = counts()
                    response = self.admin.post(url, {**own, "destination": destination})
                    self.check_page("POST", url, response, refused_only=True)
                    self.check_write(f"POST {url}", before)
        url = reverse("admin:reconciliation_pauseswitch_changelist")
        before = counts()
        response = self.admin.post(url, {"target": "global", "id": "", "paused": "1"})
        self.check_page("POST", f"{url} global", response, refused_only=True)
        self.check_write("POST global pause", before)
        for target, model in (
            ("tenant", "intake.Tenant"),
            ("mailbox", "intake.Mailbox"),
            ("destination", "ticketing.Destination"),
        ):
            for pk in sorted(owned_by(apps.get_model(model), self.owned)):
                before = counts()
                response = self.admin.post(url, {"target": target, "id": pk, "paused": "1"})
                self.check_page("POST", f"{url} {target} {pk}", response, refused_only=True)
                self.check_write(f"POST pause {target} {pk}", before)

    # API
    def api_routes(self):
        """(name, viewset, {method: action}, url kwargs) of every /api/v1/ route."""
        seen = set()
        for pattern in api_urls.router.urls:
            if pattern.name in seen:
                continue
            seen.add(pattern.name)
            callback = pattern.callback
            kwargs = [k for k in pattern.pattern.regex.groupindex if k != "format"]
            yield pattern.name, callback.cls, callback.actions, kwargs

    def api_body(self) -> dict:
        mailbox = min(owned_by(apps.get_model("intake", "Mailbox"), self.owned))
        destination = min(owned_by(apps.get_model("ticketing", "Destination"), self.owned))
        return {
            "tenant": A,
            "slug": "crawl-x",
            "address": "x@crawl.test",
            "name": "crawl-x",
            "kind": "builtin",
            "mailbox": mailbox,
            "destination": destination,
            "event_ids": sorted(self.owned[InboxEvent]),
            "preview": False,
            "reason": "crawl",
            "ticket_id": "T-1",
            "assignee": self.user.get_username(),
            "escalate_at": None,
            "paused": True,
            "enabled": False,
        }

    def api_all(self, own_destination) -> None:
        body = self.api_body()
        for name, viewset, actions, kwargs in self.api_routes():
            model = viewset.queryset.model
            a_ids = sorted(owned_by(model, self.owned))
            if not kwargs:
                url = reverse(f"api:{name}")
                for method in list(actions):
                    if method == "get":
                        for query in (
                            {},
                            {"event": min(self.owned[InboxEvent])},
                            {"state": "failed"},
                            {"mailbox": f"{A}-support"},
                            {"open": "true"},
                        ):
                            self.check_list(url, query, a_ids)
                    elif method not in ("head", "options"):
                        self.api_write(method, url, body)
                continue
            for pk in a_ids:
                url = reverse(f"api:{name}", kwargs={k: (pk if k == "pk" else 0) for k in kwargs})
                for method in list(actions):
                    if method == "get":
                        self.check_page("GET", url, self.api.get(url), refused_only=True)
                    elif method not in ("head", "options"):
                        self.api_write(method, url, {**body, "destination": own_destination}, detail=True)
                        self.api_write(method, url, body, detail=True)

    def check_list(self, url, query, a_ids) -> None:
        response = self.api.get(url, query)
        self.check_page("GET", f"{url}?{urlencode(query)}", response)
        if response.status_code == 200:
            data = response.json()
            rows = data["results"] if isinstance(data, dict) else data
            shown = {row.get("id") for row in rows if isinstance(row, dict)}
            if shown & set(a_ids):
                self.leak(f"GET {url}?{urlencode(query)} lists A's ids {sorted(shown & set(a_ids))}")

    def api_write(self, method, url, body, detail=False) -> None:
        before = counts()
        response = getattr(self.api, method)(url, body, format="json")
        self.check_page(method.upper(), url, response, refused_only=detail)
        if not detail and response.status_code not in REFUSED | {400}:
            self.leak(f"{method.upper()} {url} -> {response.status_code} with A's tenant and ids")
        self.check_write(f"{method.upper()} {url}", before)


def crawl(owned: dict, users) -> list[str]:
    """Every admin page and API route as each user; the leaks of A's rows found (an empty list: none)."""
    leaks = []
    for user in users:
        own_destination = (
            apps.get_model("ticketing", "Destination")
            .objects.filter(tenant__members=user)
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        c = Crawl(owned, user)
        c.admin_lists()
        c.admin_objects()
        c.admin_writes(own_destination)
        c.api_all(own_destination)
        leaks += c.leaks
    return leaks


# --- tests -----------------------------------------------------------------------------------------------------


def test_tenant_b_never_sees_or_changes_tenant_a(two_tenants):
    owned, users = two_tenants
    assert owned[InboxEvent] and set(
        InboxEvent.objects.filter(pk__in=owned[InboxEvent]).values_list("state", flat=True)
    ) >= {"completed", "awaiting_review", "quarantined", "failed"}
    # The crawl can see: B's own rows show up for B (markers are found where they are allowed).
    client = Client()
    client.force_login(users["everything"])
    page = client.get(reverse("admin:intake_inboxevent_changelist")).content.decode()
    assert f"{B} printer on fire" in page and A not in page
    listed = api(users["operator"]).get("/api/v1/events/").json()["results"]
    assert listed and all(row["tenant"] == B for row in listed)

    leaks = crawl(owned, users.values())
    assert leaks == [], "\n".join(leaks)


def test_the_crawl_reports_a_leak(two_tenants, monkeypatch):
    owned, users = two_tenants
    user = users["everything"]
    assert crawl(owned, [user]) == []

    monkeypatch.setattr(InboxEventAdmin, "get_queryset", lambda self, request: InboxEvent.objects.all())
    monkeypatch.setattr(MappingViewSet, "get_queryset", lambda self: TicketMapping.objects.all())
    leaks = crawl(owned, [user])
    assert any(re.search(r"GET /admin/intake/inboxevent/\?\S* -> 200 shows 'zqalpha'", leak) for leak in leaks), leaks
    assert any(re.search(r"GET /admin/intake/inboxevent/\d+/change/ -> 200", leak) for leak in leaks), leaks
    assert any(
        leak.endswith("lists A's ids " + str(sorted(owned[TicketMapping]))) or "/api/v1/mappings/" in leak
        for leak in leaks
    ), leaks


def test_the_crawl_reports_a_write_to_another_tenant(two_tenants, monkeypatch):
    """The queue actions' lookup broken (every tenant's events): B's operator changes A's items, and it is reported."""
    from reconciliation import selectors

    owned, users = two_tenants
    monkeypatch.setattr(selectors, "visible_events", lambda user, model=InboxEvent: model._default_manager.all())
    leaks = crawl(owned, [users["operator"]])
    assert any("changed A's rows" in leak for leak in leaks), leaks
    assert any(
        re.search(r"POST /admin/reconciliation/recoveryitem/\d+/act/assign_me/ -> 302", leak) for leak in leaks
    ), leaks


# --- the rules of the tenant-boundary review (issue 20) --------------------------------------------------------


def test_tenant_b_cannot_take_a_s_address_secret_or_pause(two_tenants, settings):
    """B's every-permission user and B's tenant admin try A's address (three spellings), a platform secret bound
    to A's destination and A's or everyone's pause, through the admin and the API: every try is refused and no
    row of anyone's changes."""
    from intake.models import Mailbox, Switch, Tenant
    from ticketing.models import Destination

    owned, users = two_tenants
    a_destination = Destination.objects.get(pk=min(owned_by(Destination, owned)))
    bound_ref = "env:ZQALPHA_DESK_TOKEN"
    settings.MAILROOM_PLATFORM_SECRET_REFS = [f"{bound_ref}=destination:{A}/{a_destination.slug}"]
    tenant_a = Tenant.objects.get(slug=A)
    for role in ("mailroom-admin", "everything"):
        user = users[role]
        b_mailbox = Mailbox.objects.filter(tenant__slug=B).order_by("pk").first()
        b_destination = Destination.objects.filter(tenant__slug=B).order_by("pk").first()
        c = Crawl(owned, user)
        tries = []
        for spelling in (f"support@{A}.test", f"Support@{A.upper()}.TEST", f"support+crawl@{A}.test"):
            tries += [
                (
                    "POST",
                    "/api/v1/mailboxes/",
                    {"tenant": B, "slug": "crawl-grab", "address": spelling, "provider": "raw"},
                ),
                ("PATCH", f"/api/v1/mailboxes/{b_mailbox.pk}/", {"address": spelling}),
            ]
        tries += [
            (
                "POST",
                "/api/v1/destinations/",
                {
                    "tenant": B,
                    "slug": "crawl-steal",
                    "name": "steal",
                    "kind": "zendesk",
                    "base_url": "https://b.zendesk.example",
                    "credentials_ref": bound_ref,
                },
            ),
            ("PATCH", f"/api/v1/destinations/{b_destination.pk}/", {"credentials_ref": bound_ref}),
        ]
        for method, url, body in tries:
            before = counts()
            response = getattr(c.api, method.lower())(url, body, format="json")
            if response.status_code not in REFUSED | {400}:
                c.leak(f"{method} {url} {body} -> {response.status_code}")
            # The refusal names the address tried (our input, and the uniqueness it states); nothing else of A's.
            text = response.content.decode().lower().replace(f"{A}.test", "")
            if A in text:
                c.leak(f"{method} {url} -> {response.status_code} shows {A!r} beyond the address tried")
            c.check_write(f"{method} {url} {body}", before)
        before = counts()
        response = c.admin.post(
            reverse("admin:intake_mailbox_add"),
            {
                "tenant": b_mailbox.tenant_id,
                "slug": "crawl-grab-admin",
                "address": f"support@{A}.test",
                "provider": "raw",
                "settings": "{}",
                "allowed_recipients": "[]",
            },
        )
        if response.status_code == 302:
            c.leak("admin add of A's address was saved")
        c.check_write("admin add of A's address", before)
        url = reverse("admin:reconciliation_pauseswitch_changelist")
        for target, pk in (("global", ""), ("tenant", tenant_a.pk)):
            before = counts()
            c.admin.post(url, {"target": target, "id": pk, "paused": "1"})
            c.check_write(f"pause {target}", before)
        assert not Switch.objects.filter(on=True).exists(), role
        assert c.leaks == [], "\n".join(c.leaks)
    assert Mailbox.objects.filter(address_key=f"support@{A}.test").values_list("tenant__slug", flat=True).get() == A
