"""Who a ticket is for and who is copied, and whether mail comes from one of the tenant's agents.

- `requester`: the sender, or, when one of the tenant's agents forwards a customer's message, the
  original sender (`intake.mime.forwards` reads the forward); flagged and audited by the pipeline.
- `copied`: the To and Cc addresses minus the tenant's own mailboxes, the requester and the agents.
- `is_agent`: the tenant's `agent_addresses` setting (addresses, or domains as "@example.com").
"""
from dataclasses import dataclass

from intake.domains import address_key
from intake.models import Mailbox

AGENT_ADDRESSES = "agent_addresses"


@dataclass(frozen=True)
class Requester:
    email: str
    name: str = ""
    forwarded_by: str = ""   # the agent who forwarded the customer's message; "" when not a forward


def agent_patterns(tenant) -> tuple[str, ...]:
    values = (tenant.settings or {}).get(AGENT_ADDRESSES) or []
    if not isinstance(values, list):
        return ()
    return tuple(str(v).strip().lower() for v in values if isinstance(v, str) and v.strip())


def is_agent(tenant, address: str) -> bool:
    """Is `address` one of the tenant's agents (an exact address, or an address of an agents' domain)?"""
    address = (address or "").strip().lower()
    if "@" not in address:
        return False
    domain = address.rsplit("@", 1)[1]
    for pattern in agent_patterns(tenant):
        if pattern.startswith("@") and domain == pattern[1:]:
            return True
        if "@" not in pattern and domain == pattern:
            return True
        if pattern == address:
            return True
    return False


def requester(event, parsed) -> Requester:
    """The person the ticket is for (see the module doc)."""
    return Requester(email=parsed.sender, name=parsed.sender_name)


def own_addresses(tenant_id: int) -> set[str]:
    """The tenant's mailbox addresses and allowed recipients, as address keys (no +tag, lower case)."""
    keys = set()
    for address, allowed in Mailbox.objects.filter(tenant_id=tenant_id).values_list("address", "allowed_recipients"):
        keys.add(address_key(address))
        for extra in allowed or []:
            if isinstance(extra, str) and "@" in extra:
                keys.add(address_key(extra))
    return keys


def copied(event, parsed, requester_email: str) -> tuple[str, ...]:
    """The people copied on the message, in its order, without the tenant's own addresses, the requester
    or the tenant's agents."""
    own = own_addresses(event.tenant_id)
    skip = {address_key(requester_email)} if requester_email else set()
    out = []
    for address in parsed.recipients:
        key = address_key(address)
        if not address or "@" not in address or key in own or key in skip or is_agent(event.tenant, address):
            continue
        skip.add(key)
        out.append(address)
    return tuple(out[:50])
