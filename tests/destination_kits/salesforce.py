"""The Salesforce kit for the shared contract suite (tests/test_destination_contract.py).

A lost answer is settled by the upsert on the External ID field: sending it again updates the one Case.
Note for route_of: Salesforce has one owner per Case, so a mapped assignee replaces the queue (OwnerId);
the queue then reads back as None.
"""
import json

from intake.secrets import env_prefix
from tests.factories import make_destination

DIALECT = "salesforce"
PROTECTION = "upsert"
DESK_OPTIONS: dict = {}

QUEUES = {"billing": "00G000000000001AAA", "tech": "00G000000000002AAA"}
OWNERS = {"alice": "005000000000001AAA"}
# An org that added "Urgent" to Case.Priority, so each Mailroom priority reads back as itself.
PRIORITIES = {"low": "Low", "normal": "Medium", "high": "High", "urgent": "Urgent"}
CASE_TYPES = {"refund": "Refund"}


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A salesforce destination against the running `desk` (client credentials, secret in the environment)."""
    variable = f"{env_prefix(tenant.slug)}SALESFORCE_{slug.upper().replace('-', '_')}"
    monkeypatch.setenv(variable, json.dumps({"client_id": "mailroom-connected-app",
                                             "client_secret": desk.token or "unused"}))
    return make_destination(
        tenant, slug=slug, kind="salesforce", is_default=is_default, base_url=desk.url,
        credentials_ref=f"env:{variable}",
        settings={"read_timeout": 1.0, "retry_base_seconds": 0.01, "retry_cap_seconds": 0.05,
                  "queues": QUEUES, "owners": OWNERS, "priorities": PRIORITIES, "case_types": CASE_TYPES,
                  **settings},
    )


def ticket_id_of(record: dict) -> str:
    return record["fields"]["Id"]


def route_of(record: dict) -> dict:
    fields = record["fields"]
    queues = {v: k for k, v in QUEUES.items()}
    priorities = {v: k for k, v in PRIORITIES.items()}
    return {"queue": queues.get(fields.get("OwnerId")), "priority": priorities.get(fields.get("Priority"))}


def comments_of(record: dict) -> list[str]:
    return [c["body"] for c in record["comments"][1:]]  # the first is the description
