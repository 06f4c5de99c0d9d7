"""Sender block and allow lists: what an entry matches and which one decides, what a block and an allow do in
the pipeline (suppressed with the list as the reason, replayable; the rate limit skipped), and that a
tenant's admin sees and changes only their own tenant's lists, in the console and the API."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from rest_framework.test import APIClient

from intake.models import AuditEvent, InboxEvent, SenderListEntry
from intake.sender_lists import add_sender_list_entry, remove_sender_list_entry, visible_sender_list_entries
from intake.validation.sender_lists import ListEntry, deciding_entry, lookup_keys, normalize_pattern
from intake.vocabulary import AuditKind, ReasonCode
from reconciliation.services import ensure_role_groups
from tests.factories import email_message, make_destination, make_event, make_mailbox, make_tenant
from tests.senderauth import stamped, trust_our_mta
from ticketing.replay import replay_same_key
from ticketing.services import process_inbox_event

ENTRIES = "/admin/intake/senderlistentry/"
API = "/api/v1/sender-lists/"


# --- what matches, what decides ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "typed, stored",
    [
        ("Jane@Example.COM", "jane@example.com"),
        (" jane+billing@example.com ", "jane@example.com"),  # the +tag is the same person
        ("@Example.com.", "@example.com"),
        ("@bücher.example", "@xn--bcher-kva.example"),
    ],
)
def test_patterns_are_stored_in_one_form(typed, stored):
    assert normalize_pattern(typed) == stored


@pytest.mark.parametrize(
    "typed", ["", "example.com", "@", "@com", "jane@", "a b@example.com", "@exa..mple.com", "Jane <jane@example.com>"]
)
def test_what_is_neither_an_address_nor_a_domain_is_refused_clearly(typed):
    with pytest.raises(ValueError, match="address|domain"):
        normalize_pattern(typed)


def test_a_domain_entry_covers_its_subdomains_and_the_most_specific_entry_of_the_mailbox_list_wins():
    assert lookup_keys("Bob+x@Mail.Spam.Example") == ["bob@mail.spam.example", "@mail.spam.example", "@spam.example"]
    tenant_block = ListEntry("block", "@spam.example", "tenant")
    tenant_allow = ListEntry("allow", "bob@mail.spam.example", "tenant")
    mailbox_allow = ListEntry("allow", "@spam.example", "mailbox")
    mailbox_block = ListEntry("block", "bob@mail.spam.example", "mailbox")
    assert deciding_entry("bob@mail.spam.example", [tenant_block]) == tenant_block
    assert deciding_entry("bob@mail.spam.example", [tenant_block, tenant_allow]) == tenant_allow  # address first
    assert deciding_entry("bob@mail.spam.example", [tenant_allow, mailbox_allow]) == mailbox_allow
    assert deciding_entry("bob@mail.spam.example", [tenant_block, mailbox_allow, mailbox_block]) == mailbox_block
    assert deciding_entry("bob@notspam.example", [tenant_block]) is None  # a suffix is not a subdomain
    assert deciding_entry("", [tenant_block]) is None


# --- in the pipeline ---------------------------------------------------------------------------------


def superuser():
    return get_user_model().objects.create_superuser("root", "root@staff.test", "pw-root-root")


def run(mailbox, **message) -> InboxEvent:
    event = make_event(mailbox, **message)
    process_inbox_event(event.pk)
    return InboxEvent.objects.get(pk=event.pk)


def test_a_blocked_domain_is_suppressed_with_the_list_as_its_reason_and_a_replay_makes_the_ticket(mailbox, scanner_off):
    entry = add_sender_list_entry(
        tenant=mailbox.tenant, mailbox=None, kind="block", pattern="@Spam.Example", actor=superuser()
    )

    blocked = run(mailbox, sender="Offers <deals@news.spam.example>", subject="Deals")
    welcome = run(mailbox, sender="jane@example.com", subject="Printer on fire")

    assert (blocked.state, blocked.reason_code) == ("suppressed", ReasonCode.SENDER_BLOCKED)
    assert blocked.reason_detail == "sender on the tenant's block list (entry @spam.example)"
    assert (
        AuditEvent.objects.filter(
            inbox_event=blocked, kind=AuditKind.SUPPRESSED, detail__reason=ReasonCode.SENDER_BLOCKED
        ).count()
        == 1
    )
    assert not blocked.intents.exists()
    assert welcome.state == "completed"

    assert replay_same_key(blocked.pk, actor="user:olga") == "rerouted"
    assert process_inbox_event(blocked.pk) == "created"
    assert InboxEvent.objects.get(pk=blocked.pk).state == "completed"
    assert entry.created_by == "root"


def test_a_block_wins_over_a_review_reason_but_not_over_quarantine(mailbox, scanner_off):
    add_sender_list_entry(tenant=mailbox.tenant, mailbox=None, kind="block", pattern="@spam.example", actor=superuser())
    empty = run(mailbox, sender="x@spam.example", subject="", body="")  # empty: review, were it not blocked
    assert (empty.state, empty.reason_code) == ("suppressed", ReasonCode.SENDER_BLOCKED)
    assert [f["reason"] for f in empty.details["findings"]][:1] == [ReasonCode.SENDER_BLOCKED]

    tool = run(
        mailbox,
        sender="x@spam.example",
        attachments=[("setup.exe", "application/octet-stream", b"MZ\x90\x00" + b"\x00" * 200)],
    )
    assert (tool.state, tool.reason_code) == ("quarantined", ReasonCode.ATTACHMENT_TYPE)


def authenticated(mailbox, **message) -> InboxEvent:
    """A message our MTA authenticated for its From domain (an allow counts only for such mail)."""
    domain = message["sender"].rpartition("@")[2].strip(">")
    event = make_event(mailbox, raw=stamped(email_message(**message), domain))
    process_inbox_event(event.pk)
    return InboxEvent.objects.get(pk=event.pk)


def test_an_allow_on_the_mailbox_list_overrides_a_tenant_block_and_skips_the_rate_limit(mailbox, scanner_off):
    mailbox.settings = {"sender_rate_limit": {"count": 2, "seconds": 600}}
    mailbox.save()
    trust_our_mta(mailbox)
    root = superuser()
    add_sender_list_entry(tenant=mailbox.tenant, mailbox=None, kind="block", pattern="@partner.example", actor=root)
    add_sender_list_entry(
        tenant=mailbox.tenant, mailbox=mailbox, kind="allow", pattern="alerts@partner.example", actor=root
    )
    other = make_mailbox(mailbox.tenant, slug="sales", address="sales@acme.test")

    states = [authenticated(mailbox, sender="alerts@partner.example", subject=f"Alert {n}").state for n in range(4)]
    assert states == ["completed"] * 4  # allowed: past the limit of 2 in 10 minutes
    limited = [run(mailbox, sender="jane@example.com", subject=f"Hello {n}") for n in range(3)]
    assert [e.reason_code for e in limited] == ["", "", ReasonCode.SENDER_RATE_LIMITED]
    # The allow is the mailbox's: on the tenant's other mailboxes the tenant's block holds.
    elsewhere = run(other, sender="alerts@partner.example", to="sales@acme.test")
    assert elsewhere.reason_code == ReasonCode.SENDER_BLOCKED


def test_a_forged_from_on_an_allowed_address_does_not_skip_the_rate_limit(mailbox, scanner_off):
    mailbox.settings = {"sender_rate_limit": {"count": 2, "seconds": 600}}
    mailbox.save()
    trust_our_mta(mailbox)
    add_sender_list_entry(
        tenant=mailbox.tenant, mailbox=None, kind="allow", pattern="@partner.example", actor=superuser()
    )

    # Nobody authenticated these (no trusted results), or our MTA saw DMARC fail: anyone can type the address.
    forged = [run(mailbox, sender="alerts@partner.example", subject=f"Alert {n}") for n in range(2)]
    forged.append(
        make_event(
            mailbox,
            raw=stamped(
                email_message(sender="alerts@partner.example", subject="Alert 2"),
                "partner.example",
                spf="fail",
                dkim="fail",
                dmarc="fail",
            ),
        )
    )
    process_inbox_event(forged[-1].pk)

    reasons = [InboxEvent.objects.get(pk=e.pk).reason_code for e in forged]
    assert reasons == ["", "", ReasonCode.SENDER_RATE_LIMITED]


# --- tenant scoping -------------------------------------------------------------------------------------


@pytest.fixture
def two_tenants(mailbox):
    other = make_tenant(slug="globex", name="Globex", domains=("globex.test",))
    make_destination(other)
    theirs = make_mailbox(other, slug="help", address="help@globex.test")
    return mailbox.tenant, mailbox, other, theirs


def tenant_admin(username, tenant):
    ensure_role_groups()
    user = get_user_model().objects.create_user(username, f"{username}@staff.test", "pw-" + username * 3, is_staff=True)
    user.groups.set(Group.objects.filter(name="mailroom-admin"))
    tenant.members.add(user)
    return get_user_model().objects.get(pk=user.pk)


def test_the_service_keeps_each_admin_to_their_own_tenant(two_tenants):
    acme, acme_mailbox, globex, globex_mailbox = two_tenants
    bea = tenant_admin("bea", globex)
    with pytest.raises(PermissionDenied):
        add_sender_list_entry(tenant=acme, mailbox=None, kind="block", pattern="@x.example", actor=bea)
    with pytest.raises(PermissionDenied):  # another tenant's mailbox, filed under her own tenant
        add_sender_list_entry(tenant=globex, mailbox=acme_mailbox, kind="block", pattern="@x.example", actor=bea)
    with pytest.raises(ValidationError, match="not a domain"):
        add_sender_list_entry(tenant=globex, mailbox=None, kind="block", pattern="@x", actor=bea)
    add_sender_list_entry(tenant=globex, mailbox=globex_mailbox, kind="block", pattern="@x.example", actor=bea)
    with pytest.raises(ValidationError, match="already on mailbox help's list"):
        add_sender_list_entry(tenant=globex, mailbox=globex_mailbox, kind="allow", pattern="@X.example", actor=bea)
    assert SenderListEntry.objects.filter(tenant=acme).count() == 0


def test_an_admin_of_another_tenant_neither_sees_nor_adds_entries_in_the_console(two_tenants, client):
    acme, acme_mailbox, globex, globex_mailbox = two_tenants
    secret = add_sender_list_entry(
        tenant=acme, mailbox=None, kind="block", pattern="ceo-rival@competitor.example", actor=superuser()
    )
    bea = tenant_admin("bea", globex)
    client.force_login(bea)

    listing = client.get(ENTRIES)
    assert listing.status_code == 200
    assert "competitor.example" not in listing.content.decode()
    assert client.get(f"{ENTRIES}{secret.pk}/change/").status_code == 404

    refused = client.post(f"{ENTRIES}add/", {"tenant": acme.pk, "kind": "block", "pattern": "@x.example"})
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    refused = client.post(
        f"{ENTRIES}add/", {"tenant": globex.pk, "mailbox": acme_mailbox.pk, "kind": "block", "pattern": "@x.example"}
    )
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert SenderListEntry.objects.filter(pattern="@x.example").count() == 0

    added = client.post(
        f"{ENTRIES}add/",
        {
            "tenant": globex.pk,
            "mailbox": globex_mailbox.pk,
            "kind": "block",
            "pattern": "Deals@Spam.Example",
            "note": "weekly offers",
        },
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    entry = SenderListEntry.objects.get(tenant=globex)
    assert (entry.pattern, entry.mailbox, entry.created_by) == ("deals@spam.example", globex_mailbox, "bea")
    page = client.get(ENTRIES).content.decode()
    assert "deals@spam.example" in page and "mailbox help" in page
    bad = client.post(f"{ENTRIES}add/", {"tenant": globex.pk, "kind": "block", "pattern": "spam.example"})
    assert "is not an address" in bad.content.decode()
    assert list(visible_sender_list_entries(bea)) == [entry]


def test_an_admin_of_another_tenant_neither_sees_nor_adds_entries_through_the_api(two_tenants):
    acme, acme_mailbox, globex, globex_mailbox = two_tenants
    secret = add_sender_list_entry(
        tenant=acme, mailbox=None, kind="allow", pattern="@partner.example", actor=superuser()
    )
    api = APIClient()
    api.force_authenticate(tenant_admin("bea", globex))

    listed = api.get(API)
    assert listed.status_code == 200
    assert "partner.example" not in listed.content.decode()
    assert api.get(f"{API}{secret.pk}/").status_code == 404
    assert api.delete(f"{API}{secret.pk}/").status_code == 404
    assert api.post(API, {"tenant": "acme", "kind": "block", "pattern": "@x.example"}, format="json").status_code == 400
    assert (
        api.post(
            API,
            {"tenant": "globex", "mailbox": acme_mailbox.pk, "kind": "block", "pattern": "@x.example"},
            format="json",
        ).status_code
        == 400
    )
    assert SenderListEntry.objects.filter(pattern="@x.example").count() == 0

    made = api.post(
        API,
        {"tenant": "globex", "mailbox": globex_mailbox.pk, "kind": "block", "pattern": "@Spam.Example"},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert made.json()["pattern"] == "@spam.example" and made.json()["created_by"] == "bea"
    again = api.post(
        API,
        {"tenant": "globex", "mailbox": globex_mailbox.pk, "kind": "allow", "pattern": "@spam.example"},
        format="json",
    )
    assert again.status_code == 400 and "already on" in again.content.decode()
    assert api.delete(f"{API}{made.json()['id']}/").status_code == 204
    assert SenderListEntry.objects.filter(tenant=acme).count() == 1


def test_removing_an_entry_leaves_a_trace_naming_who_without_the_full_address(mailbox, caplog):
    root = superuser()
    entry = add_sender_list_entry(
        tenant=mailbox.tenant, mailbox=mailbox, kind="block", pattern="spammer@spam.example", actor=root
    )
    stranger = make_tenant(slug="initech", name="Initech", domains=("initech.test",))
    outsider = get_user_model().objects.create_user("ivy", "ivy@staff.test", "pw-for-tests-only-42")
    stranger.members.add(outsider)
    with pytest.raises(PermissionDenied):
        remove_sender_list_entry(entry=entry, actor=outsider)

    with caplog.at_level("WARNING", logger="mailroom.audit"):
        remove_sender_list_entry(entry=entry, actor=root)

    assert not SenderListEntry.objects.filter(pk=entry.pk).exists()
    [line] = [r.getMessage() for r in caplog.records if r.name == "mailroom.audit"]
    assert "block" in line and "removed from tenant acme mailbox support by root" in line
    assert "spammer@spam.example" not in line
