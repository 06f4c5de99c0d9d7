"""The HubSpot kit for the shared contract suite (tests/test_destination_contract.py).

A lost answer is settled by the upsert on the unique `mailroom_ref` property: sending it again updates the
one ticket. Queues are pipelines (with their first stage); priorities are HubSpot's own four words. Unknown
senders and CC'd addresses become contacts (create_contacts), associated with the ticket: that is where the
addresses show (the first associated is the requester). A customer's reply is a logged incoming email from the
customer (public, authored); an agent's is a note, internal, written by the private app with a "From:" line
first; a file is a note of its own carrying it (hs_attachment_ids), not a comment. A follow-up is associated
with the closed ticket. HubSpot's notifications carry no reference Mailroom reads.
"""

import re

from fakedesk.dialects.freshdesk import html_to_text
from intake.secrets import env_prefix
from tests.factories import make_destination

DIALECT = "hubspot"
PROTECTION = "upsert"
DESK_OPTIONS: dict = {}

QUEUES = {"billing": "billing-pipeline:billing-new", "tech": "tech-pipeline:tech-new"}
PRIORITIES = {"low": "LOW", "normal": "MEDIUM", "high": "HIGH", "urgent": "URGENT"}
OWNERS = {"alice": "7001"}
CATEGORIES = {"refund": "BILLING_ISSUE"}

CC_ON_RECORD = True  # associated contacts
AUTHORED_COMMENTS = True  # a customer's reply is an email from the customer (an agent's note has a "From:" line)


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A hubspot destination against the running `desk` (a private app token in the environment)."""
    variable = f"{env_prefix(tenant.slug)}HUBSPOT_{slug.upper().replace('-', '_')}"
    monkeypatch.setenv(variable, desk.token or "unused")
    return make_destination(
        tenant,
        slug=slug,
        kind="hubspot",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref=f"env:{variable}",
        settings={
            "read_timeout": 1.0,
            "retry_base_seconds": 0.01,
            "retry_cap_seconds": 0.05,
            "portal_id": "4242",
            "queues": QUEUES,
            "priorities": PRIORITIES,
            "owners": OWNERS,
            "categories": CATEGORIES,
            # No request budget unless a test asks for one (the kind's 600 a minute is HubSpot's).
            "create_contacts": True,
            "requests_per_minute": 0,
            **settings,
        },
    )


def ticket_id_of(record: dict) -> str:
    return str(record["id"])


def route_of(record: dict) -> dict:
    fields = record["fields"]
    pipelines = {v.partition(":")[0]: k for k, v in QUEUES.items()}
    priorities = {v: k for k, v in PRIORITIES.items()}
    return {
        "queue": pipelines.get(fields.get("hs_pipeline")),
        "priority": priorities.get(fields.get("hs_ticket_priority")),
    }


def note_text(body: str) -> str:
    """A note's HTML as text: a paragraph per blank-line-separated block, <br> a line break."""
    return html_to_text(re.sub(r"</p>\s*", "\n\n", body or "")).strip()


def _replies(record: dict) -> list[dict]:
    """The notes and emails after the ticket's content (the store's first comment), without the notes that
    carry a file, each with its text (a note is HTML, an email's hs_email_text plain)."""
    replies = []
    for comment in record["comments"][1:]:
        custom = (comment.get("metadata") or {}).get("custom") or {}
        if custom.get("hs_attachment_ids"):
            continue
        text = comment["body"] if custom.get("email") else note_text(comment["body"])
        replies.append({"body": text, "public": comment["public"], "author": comment["author"]})
    return replies


def comments_of(record: dict) -> list[str]:
    return [reply["body"] for reply in _replies(record)]


def comment_records_of(record: dict) -> list[dict]:
    return _replies(record)


def follow_up_of(record: dict) -> str | None:
    """The closed ticket this one follows: an associated ticket made before it."""
    older = [
        int(t["id"])
        for t in (record["fields"].get("associations") or {}).get("tickets") or []
        if int(t["id"]) < int(record["id"])
    ]
    return str(min(older)) if older else None


def desk_reference(record: dict) -> str:
    """HubSpot's notifications name no ticket Mailroom reads (no reference is declared)."""
    return ""
