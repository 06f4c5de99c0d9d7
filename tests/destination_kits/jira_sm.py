"""Jira Service Management against FakeDesk's jira_sm dialect: no key, a JQL search that lags."""

import re

from intake.secrets import env_prefix
from tests.factories import make_destination

DIALECT = "jira_sm"
PROTECTION = "lagging_search"
DESK_OPTIONS = {"search_lag_seconds": 0.3}
# The people copied are request participants; every comment is written as the integration account.
CC_ON_RECORD = True
AUTHORED_COMMENTS = False

# Option values of the fake's "Queue" select field (customfield_10060) and Jira's default priority names.
QUEUES = {"billing": "Billing", "tech": "Technical"}
PRIORITIES = {"low": "Low", "normal": "Medium", "high": "High", "urgent": "Highest"}


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A jira_sm destination against `desk`, its credentials in a tenant-scoped environment variable."""
    credentials_ref = ""
    if desk.token:
        variable = f"{env_prefix(tenant.slug)}JIRA_SM_{slug.upper().replace('-', '_')}"
        monkeypatch.setenv(variable, f"agent@{tenant.slug}.test:{desk.token}")
        credentials_ref = f"env:{variable}"
    return make_destination(
        tenant,
        slug=slug,
        kind="jira_sm",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref=credentials_ref,
        settings={
            "read_timeout": 1.0,
            "retry_base_seconds": 0.01,
            "retry_cap_seconds": 0.05,
            "search_settle_seconds": 1.0,
            "service_desk_id": "1",
            "request_type_id": "10",
            "request_types": {"refund": "21"},
            "queue_field": "customfield_10060",
            "queues": QUEUES,
            "priorities": PRIORITIES,
            "external_ref_field": "customfield_10050",
            "assignee_field": "customfield_10070",
            "assignees": {"alice": "5b10a2844c20165700ede21g"},
            "project_key": "SUP",
            **settings,
        },
    )


def ticket_id_of(record: dict) -> str:
    return record["fields"]["issueKey"]


def route_of(record: dict) -> dict:
    values = record["fields"].get("requestFieldValues") or {}
    queue_option = (values.get("customfield_10060") or {}).get("value")
    priority_name = (values.get("priority") or {}).get("name")
    return {
        "queue": next((slug for slug, option in QUEUES.items() if option == queue_option), None),
        "priority": next((word for word, name in PRIORITIES.items() if name == priority_name), None),
    }


def comments_of(record: dict) -> list[str]:
    return [c["body"] for c in record.get("comments") or []][1:]  # the first is the description


def comment_records_of(record: dict) -> list[dict]:
    """The comments after the description: {"body", "public", "author"}."""
    return [{"body": c["body"], "public": c["public"], "author": c["author"]} for c in record.get("comments") or []][1:]


def follow_up_of(record: dict) -> str | None:
    """The closed request a follow-up names in its description's first line."""
    found = re.match(r"Follow-up of ([A-Z][A-Z0-9_]*-\d+),", record.get("description") or "")
    return found.group(1) if found else None


def desk_reference(record: dict) -> str:
    """What a reply to JSM's notification carries in its subject: the request's key."""
    return record["fields"]["issueKey"] if record else ""
