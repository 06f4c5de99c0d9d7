"""ServiceNow against FakeDesk's servicenow dialect: Table API creates, settled by the consistent
correlation_id lookup (no idempotency key)."""

from fakedesk.dialects.servicenow_records import watermark
from intake.secrets import env_prefix
from tests.factories import make_destination
from ticketing.destinations.servicenow import DEFAULT_PRIORITIES

DIALECT = "servicenow"
PROTECTION = "consistent_lookup"
DESK_OPTIONS: dict = {}
# The people copied are on the watch list; every journal entry is written as the integration user.
CC_ON_RECORD = True
AUTHORED_COMMENTS = False

GROUPS = {"billing": "Billing", "tech": "Service Desk"}


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A servicenow destination against `desk`, its password in a tenant-scoped environment variable."""
    credentials_ref = ""
    if desk.token:
        variable = f"{env_prefix(tenant.slug)}SERVICENOW_{slug.upper().replace('-', '_')}"
        monkeypatch.setenv(variable, f"mailroom.integration:{desk.token}")
        credentials_ref = f"env:{variable}"
    return make_destination(
        tenant,
        slug=slug,
        kind="servicenow",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref=credentials_ref,
        settings={
            "read_timeout": 1.0,
            "retry_base_seconds": 0.01,
            "retry_cap_seconds": 0.05,
            "assignment_groups": GROUPS,
            "categories": {"refund": "inquiry"},
            "assignees": {"alice": "alice.agent"},
            **settings,
        },
    )


def ticket_id_of(record: dict) -> str:
    return record["fields"]["sys_id"]


def route_of(record: dict) -> dict:
    fields = record.get("fields") or {}
    queue = next((slug for slug, group in GROUPS.items() if group == fields.get("assignment_group")), None)
    levels = {"impact": fields.get("impact"), "urgency": fields.get("urgency")}
    priority = next((word for word, mapped in DEFAULT_PRIORITIES.items() if mapped == levels), None)
    return {"queue": queue, "priority": priority}


def comments_of(record: dict) -> list[str]:
    return [c["body"] for c in record.get("comments") or []][1:]  # the first is the description


def comment_records_of(record: dict) -> list[dict]:
    """The journal entries after the description: {"body", "public", "author"}."""
    return [{"body": c["body"], "public": c["public"], "author": c["author"]} for c in record.get("comments") or []][1:]


def follow_up_of(record: dict) -> str | None:
    """The closed incident a follow-up names as its parent."""
    return (record.get("fields") or {}).get("parent_incident") or None


def desk_reference(record: dict) -> str:
    """What a reply to ServiceNow's notification carries: the watermark of its last line."""
    return f"Ref:{watermark(record['id'], record['fields']['sys_id'])}" if record else ""
