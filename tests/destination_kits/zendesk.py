"""Zendesk against FakeDesk's default dialect: Idempotency-Key kept 2 h, listing by external_id; files uploaded
first and named by token, people on the record, comments authored, follow-ups of closed tickets."""

from tests.factories import make_destination

DIALECT = "zendesk"
PROTECTION = "key"
DESK_OPTIONS: dict = {}

GROUPS = {"billing": 360001, "tech": 360002}
# The CC'd addresses end on the record (email_ccs), and a customer's reply is written as the customer.
CC_ON_RECORD = True
AUTHORED_COMMENTS = True
PRIORITIES = ("low", "normal", "high", "urgent")


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    monkeypatch.setenv("FAKEDESK_CREDENTIALS", f"agent@{tenant.slug}.test/token:{desk.token}")
    return make_destination(
        tenant,
        slug=slug,
        kind="zendesk",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref="env:FAKEDESK_CREDENTIALS",
        settings={
            "read_timeout": 1.0,
            "retry_base_seconds": 0.01,
            "retry_cap_seconds": 0.05,
            "groups": GROUPS,
            "ticket_types": {"refund": "task"},
            "assignees": {"alice": 9001},
            **settings,
        },
    )


def ticket_id_of(record: dict) -> str:
    return str(record["id"])


def route_of(record: dict) -> dict:
    # FakeDesk keeps Zendesk's standard fields (priority, group_id, ...) in "fields".
    fields = record.get("fields") or {}
    group = fields.get("group_id")
    queue = next((slug for slug, group_id in GROUPS.items() if group_id == group), None)
    priority = fields.get("priority")
    return {"queue": queue, "priority": priority if priority in PRIORITIES else None}


def comments_of(record: dict) -> list[str]:
    return [c["body"] for c in record.get("comments") or []][1:]  # the first is the description


def comment_records_of(record: dict) -> list[dict]:
    """The comments after the description: body, public, and who wrote it (an address; "" for the API user)."""
    return [
        {"body": c["body"], "public": c["public"], "author": c["author"]} for c in (record.get("comments") or [])[1:]
    ]


def follow_up_of(record: dict) -> str | None:
    """The closed ticket this one follows up (Zendesk's via_followup_source_id), or None."""
    source = (record.get("fields") or {}).get("via_followup_source_id")
    return None if source is None else str(source)


def desk_reference(record: dict) -> str:
    """What the subject of a reply to Zendesk's notification about `record` carries: "Request #<id>"."""
    return f"Request #{record['id']}"
