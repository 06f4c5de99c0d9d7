"""Generic REST against FakeDesk's rest dialect, declared the way an admin would: an Idempotency-Key
header the API keeps (what settles a lost answer), a consistent lookup, comments and a health check.
Files go inline (`files` "inline": `files_json` in the create and comment bodies, under the create's key, so a
retry sends the same body and the API answers the first record); the requester and CCs go in the body, a
comment carries its author and public flag, and a comment on a closed record is answered 409 (`closed_status`)."""

from intake.secrets import env_prefix
from tests.factories import make_destination

DIALECT = "rest"
PROTECTION = "key"
DESK_OPTIONS: dict = {}
# The body template writes the CCs and the comment template the author: both end on the record.
CC_ON_RECORD = True
AUTHORED_COMMENTS = True

QUEUES = {"billing": "Billing", "tech": "Tech"}
PRIORITIES = {"low": "P4", "normal": "P3", "high": "P2", "urgent": "P1"}
# Route fields first, each only when it has a value, so that the fixed fields close the object.
BODY_TEMPLATE = """{
  {% if queue %}"queue": "{{ queue }}",{% endif %}
  {% if priority %}"priority": "{{ priority }}",{% endif %}
  {% if request_type %}"type": "{{ request_type }}",{% endif %}
  {% if assignee %}"assignee": "{{ assignee }}",{% endif %}
  {% if html %}"html": "{{ html }}",{% endif %}
  {% if follow_up_of %}"follow_up_of": "{{ follow_up_of }}",{% endif %}
  "subject": "{{ subject }}",
  "description": "{{ description }}",
  "requester": {"email": "{{ requester_email }}", "name": "{{ requester_name }}"},
  "cc": {{ cc_json }},
  "tags": {{ tags_json }},
  "attachments": {{ files_json }},
  "external_ref": "{{ external_ref }}"
}"""
COMMENT_TEMPLATE = """{"body": "{{ body }}", "public": {{ public }},
  "author": {"email": "{{ author }}", "name": "{{ author_name }}"}, "attachments": {{ files_json }}}"""
SETTINGS = {
    "create_url": "/records",
    "body_template": BODY_TEMPLATE,
    "id_path": "data.id",
    "headers": {"Authorization": "Bearer {secret}"},
    "ticket_url_template": "/records/{ticket_id}",
    "idempotency_header": "Idempotency-Key",
    "idempotency_window_seconds": 7200,
    "lookup_url_template": "/records?ref={external_ref}",
    "lookup_id_path": "data.0.id",
    "comment_url_template": "/records/{ticket_id}/comments",
    "comment_body_template": COMMENT_TEMPLATE,
    "comment_id_path": "data.id",
    "check_url": "/health",
    "queues": QUEUES,
    "priorities": PRIORITIES,
    "request_types": {"refund": "refund-request"},
    "assignees": {"alice": "agent-alice"},
    "files": "inline",
    "closed_status": 409,
}


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A rest destination against `desk`, its bearer token in a tenant-scoped environment variable."""
    credentials_ref = ""
    declared = {**SETTINGS}
    if desk.token:
        variable = f"{env_prefix(tenant.slug)}REST_{slug.upper().replace('-', '_')}"
        monkeypatch.setenv(variable, desk.token)
        credentials_ref = f"env:{variable}"
    else:
        declared.pop("headers")
    return make_destination(
        tenant,
        slug=slug,
        kind="rest",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref=credentials_ref,
        settings={"read_timeout": 1.0, "retry_base_seconds": 0.01, "retry_cap_seconds": 0.05, **declared, **settings},
    )


def ticket_id_of(record: dict) -> str:
    return str(record["id"])


def route_of(record: dict) -> dict:
    fields = record.get("fields") or {}
    queue = next((word for word, value in QUEUES.items() if value == fields.get("queue")), None)
    priority = next((word for word, value in PRIORITIES.items() if value == fields.get("priority")), None)
    return {"queue": queue, "priority": priority}


def comments_of(record: dict) -> list[str]:
    return [c["body"] for c in record.get("comments") or []][1:]  # the first is the description


def comment_records_of(record: dict) -> list[dict]:
    """The comments after the description: their text, whether the requester sees them, who wrote them."""
    return [
        {"body": c["body"], "public": c["public"], "author": c["author"]} for c in (record.get("comments") or [])[1:]
    ]


def follow_up_of(record: dict) -> str | None:
    """The closed record this one follows up, as the body template sends it."""
    return (record.get("fields") or {}).get("follow_up_of") or None


def desk_reference(record: dict) -> str:
    """The API's notifications name no record unless `reference_template` is declared (this kit declares none)."""
    return ""
