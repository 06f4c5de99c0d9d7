"""The Salesforce kit for the shared contract suite (tests/test_destination_contract.py).

A lost answer is settled by the upsert on the External ID field: sending it again updates the one Case.
Note for route_of: Salesforce has one owner per Case, so a mapped assignee replaces the queue (OwnerId);
the queue then reads back as None. A Case has no CC: the CC'd addresses are listed in its Description. A
CaseComment is written by the API user, opening with a "From:" line. Files are ContentVersions on the Case
(the fake's attachments); a follow-up's ParentId is the closed Case; Email-to-Case's Ref ID names a Case.
"""

import json

from intake.secrets import env_prefix
from tests.factories import make_destination
from ticketing.destinations.salesforce import thread_reference

DIALECT = "salesforce"
PROTECTION = "upsert"
DESK_OPTIONS: dict = {}

QUEUES = {"billing": "00G000000000001AAA", "tech": "00G000000000002AAA"}
OWNERS = {"alice": "005000000000001AAA"}
# An org that added "Urgent" to Case.Priority, so each Mailroom priority reads back as itself.
PRIORITIES = {"low": "Low", "normal": "Medium", "high": "High", "urgent": "Urgent"}
CASE_TYPES = {"refund": "Refund"}
# The organization the fake signs in to (its token answer's identity URL names it).
ORG_ID = "00D000000000001AAA"

CC_ON_RECORD = False  # listed in the Description ("CC: ...")
AUTHORED_COMMENTS = False  # the API user writes every CaseComment; a "From:" line names the author


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A salesforce destination against the running `desk` (client credentials, secret in the environment)."""
    variable = f"{env_prefix(tenant.slug)}SALESFORCE_{slug.upper().replace('-', '_')}"
    monkeypatch.setenv(
        variable, json.dumps({"client_id": "mailroom-connected-app", "client_secret": desk.token or "unused"})
    )
    return make_destination(
        tenant,
        slug=slug,
        kind="salesforce",
        is_default=is_default,
        base_url=desk.url,
        credentials_ref=f"env:{variable}",
        # No request budget unless a test asks for one: the kind's 40 a minute would pace every test.
        settings={
            "read_timeout": 1.0,
            "retry_base_seconds": 0.01,
            "retry_cap_seconds": 0.05,
            "requests_per_minute": 0,
            "queues": QUEUES,
            "owners": OWNERS,
            "priorities": PRIORITIES,
            "case_types": CASE_TYPES,
            **settings,
        },
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


def comment_records_of(record: dict) -> list[dict]:
    return [{"body": c["body"], "public": c["public"], "author": c["author"]} for c in record["comments"][1:]]


def follow_up_of(record: dict) -> str | None:
    return record["fields"].get("ParentId") or None


def desk_reference(record: dict) -> str:
    """What Email-to-Case's notification about this Case carries in its subject (Ref ID threading)."""
    return f"[ {thread_reference(ORG_ID, record['fields']['Id'])} ]"
