"""Freshdesk against FakeDesk's freshdesk dialect: no key, a filter search that lags. Files go with the write
(multipart attachments[]), CCs are the ticket's cc_emails, a customer's reply is a note written as their contact."""

import re

from fakedesk.dialects.freshdesk import html_to_text
from intake.secrets import env_prefix
from tests.factories import make_destination

DIALECT = "freshdesk"
PROTECTION = "lagging_search"
DESK_OPTIONS = {"search_lag_seconds": 0.3}
# The CC'd people are on the record (cc_emails); a customer's reply is written as the customer.
CC_ON_RECORD = True
AUTHORED_COMMENTS = True

# The fake's groups and agents (fakedesk.dialects.freshdesk) and Freshdesk's priority scale.
GROUPS = {"billing": 101, "tech": 102}
PRIORITIES = {"low": 1, "normal": 2, "high": 3, "urgent": 4}


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A freshdesk destination against `desk`, its credentials in a tenant-scoped environment variable."""
    credentials_ref = ""
    if desk.token:
        variable = f"{env_prefix(tenant.slug)}FRESHDESK_{slug.upper().replace('-', '_')}"
        monkeypatch.setenv(variable, f"{desk.token}:X")
        credentials_ref = f"env:{variable}"
    return make_destination(
        tenant,
        slug=slug,
        kind="freshdesk",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref=credentials_ref,
        # No request budget unless a test asks for one: the kind's 80 a minute would pace every test.
        settings={
            "read_timeout": 1.0,
            "retry_base_seconds": 0.01,
            "retry_cap_seconds": 0.05,
            "requests_per_minute": 0,
            "search_settle_seconds": 1.0,
            "groups": GROUPS,
            "agents": {"alice": 201},
            "ticket_types": {"refund": "Refund"},
            **settings,
        },
    )


def ticket_id_of(record: dict) -> str:
    return str(record["id"])


def route_of(record: dict) -> dict:
    fields = record.get("fields") or {}
    return {
        "queue": next((slug for slug, group in GROUPS.items() if group == fields.get("group_id")), None),
        "priority": next((word for word, n in PRIORITIES.items() if n == fields.get("priority")), None),
    }


def comments_of(record: dict) -> list[str]:
    # Freshdesk keeps notes as HTML; the contract compares text.
    return [html_to_text(c["body"]) for c in record.get("comments") or []][1:]  # the first is the description


def comment_records_of(record: dict) -> list[dict]:
    """The notes after the description: their text, whether the customer sees them, who wrote them ("": the API
    user)."""
    return [
        {"body": html_to_text(c["body"]), "public": c["public"], "author": c["author"]}
        for c in (record.get("comments") or [])[1:]
    ]


def follow_up_of(record: dict) -> str | None:
    """The closed ticket this one follows up: Freshdesk has no link between tickets, the description names it."""
    found = re.search(r"Follow-up of ticket #(\d+), which is closed", html_to_text(record.get("description") or ""))
    return found.group(1) if found else None


def desk_reference(record: dict) -> str:
    """What a reply to Freshdesk's own notification about this ticket carries in its subject."""
    return f"[#{record['id']}]"
