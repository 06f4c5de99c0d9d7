"""The HubSpot kit for the shared contract suite (tests/test_destination_contract.py).

A lost answer is settled by the upsert on the unique `mailroom_ref` property: sending it again updates the
one ticket. Queues are pipelines (with their first stage); priorities are HubSpot's own four words. Unknown
senders become contacts (create_contacts), associated with the ticket: that is where the address shows.
"""
from intake.secrets import env_prefix
from tests.factories import make_destination

DIALECT = "hubspot"
PROTECTION = "upsert"
DESK_OPTIONS: dict = {}

QUEUES = {"billing": "billing-pipeline:billing-new", "tech": "tech-pipeline:tech-new"}
PRIORITIES = {"low": "LOW", "normal": "MEDIUM", "high": "HIGH", "urgent": "URGENT"}
OWNERS = {"alice": "7001"}
CATEGORIES = {"refund": "BILLING_ISSUE"}


def configure(tenant, desk, monkeypatch, *, slug="desk", is_default=True, **settings):
    """A hubspot destination against the running `desk` (a private app token in the environment)."""
    variable = f"{env_prefix(tenant.slug)}HUBSPOT_{slug.upper().replace('-', '_')}"
    monkeypatch.setenv(variable, desk.token or "unused")
    return make_destination(
        tenant, slug=slug, kind="hubspot", is_default=is_default, base_url=desk.url,
        credentials_ref=f"env:{variable}",
        settings={"read_timeout": 1.0, "retry_base_seconds": 0.01, "retry_cap_seconds": 0.05, "portal_id": "4242",
                  "queues": QUEUES, "priorities": PRIORITIES, "owners": OWNERS, "categories": CATEGORIES,
                  "create_contacts": True, **settings},
    )


def ticket_id_of(record: dict) -> str:
    return str(record["id"])


def route_of(record: dict) -> dict:
    fields = record["fields"]
    pipelines = {v.partition(":")[0]: k for k, v in QUEUES.items()}
    priorities = {v: k for k, v in PRIORITIES.items()}
    return {"queue": pipelines.get(fields.get("hs_pipeline")),
            "priority": priorities.get(fields.get("hs_ticket_priority"))}


def comments_of(record: dict) -> list[str]:
    return [c["body"] for c in record["comments"][1:]]  # the first is the ticket's content
