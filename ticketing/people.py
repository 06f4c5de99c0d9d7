"""Who a ticket is for and who is copied, and whether mail comes from one of the tenant's agents.

- `requester`: the address an operator entered for mail without a usable sender (`entered_requester`), else
  the sender; but when one of the tenant's agents forwards a customer's message (an inline
  forward block or an attached message: `intake.mime.forwards`), the original sender, unless that is an
  agent too or one of the tenant's own addresses. `Requester.forwarded_by` then names the agent: the
  pipeline flags the ticket (`AGENT_FORWARD`) and audits it. A forward from anyone else keeps its sender.
- `copied`: the To and Cc addresses minus the tenant's own mailboxes, the requester and the agents.
- `is_agent`: the tenant's `agent_addresses` setting (`Tenant.settings`): a list of addresses, or of
  domains written "@example.com"; compared by address key (case, +tag and IDNA do not matter).
- `comment_kind`: (public, from_agent) of a reply: an agent's mail is an internal note, never a public
  customer comment.

Agent status is read from From as written: it decides only where a comment is shown (an internal note is
the cautious side) and whom a forward is for (flagged for a person to see).
"""

from dataclasses import dataclass

from intake import groupcache
from intake.domains import address_key, normalize_domain, split_address
from intake.mime import parse_message
from intake.mime.forwards import forwarded_original
from intake.models import Mailbox
from intake.vocabulary import ReasonCode

from .ack_policy import sender_authentication

AGENT_ADDRESSES = "agent_addresses"
# The flag (ticket tag `mailroom-agent-forward`, audit) of a ticket whose requester an agent's forward named.
AGENT_FORWARD = "agent_forward"
# Where the pipeline keeps that requester on the creating event (`InboxEvent.details`): the original sender
# takes part in the ticket's thread as its requester (`ticketing.threads.participants`).
FORWARDED_REQUESTER = "forwarded_requester"
MAX_COPIED = 50
# Where the console keeps the requester an operator entered for mail without a usable sender
# (`InboxEvent.details`, {"address", "by", "at"}; `reconciliation.services.do_enter_requester`).
REQUESTER_ENTERED = "requester_entered"


@dataclass(frozen=True)
class Requester:
    email: str
    name: str = ""
    forwarded_by: str = ""  # the agent who forwarded the customer's message; "" when not a forward


def agent_patterns(tenant) -> tuple[tuple[str, str], ...]:
    """The tenant's agents as ("address", key) and ("domain", normalised domain) entries."""
    values = (getattr(tenant, "settings", None) or {}).get(AGENT_ADDRESSES) or []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list | tuple):
        return ()
    patterns = []
    for value in values:
        if not isinstance(value, str) or not value.strip():
            continue
        value = value.strip()
        if "@" in value.lstrip("@"):
            key = address_key(value)
            if key:
                patterns.append(("address", key))
        else:  # "@example.com", or a bare "example.com"
            patterns.append(("domain", normalize_domain(value.lstrip("@"))))
    return tuple(patterns)


def is_agent(tenant, address: str) -> bool:
    """Is `address` one of the tenant's agents (a listed address, or an address in an agents' domain)?"""
    local, domain = split_address(address)
    if not local:
        return False
    key = address_key(address)
    return any(
        (kind == "address" and value == key) or (kind == "domain" and value == domain)
        for kind, value in agent_patterns(tenant)
    )


def own_addresses(tenant_id: int) -> frozenset[str]:
    """The tenant's mailbox addresses and allowed recipients, as address keys (no +tag, lower case); read
    once per task group (`intake.groupcache`)."""
    return groupcache.remembered(("own_addresses", tenant_id), lambda: _read_own_addresses(tenant_id))


def _read_own_addresses(tenant_id: int) -> frozenset[str]:
    keys = set()
    for address, allowed in Mailbox.objects.filter(tenant_id=tenant_id).values_list("address", "allowed_recipients"):
        keys.add(address_key(address))
        for extra in allowed or []:
            if isinstance(extra, str) and "@" in extra:
                keys.add(address_key(extra))
    return frozenset(keys)


def entered_requester(event) -> str:
    """The address an operator entered as the event's requester, or ""."""
    entry = (getattr(event, "details", None) or {}).get(REQUESTER_ENTERED)
    address = entry.get("address") if isinstance(entry, dict) else None
    return address if isinstance(address, str) and "@" in address else ""


def lacks_requester(event) -> bool:
    """Would a ticket made now be for nobody? No usable sender (validation said so, or the stored message
    has none) and no address entered by an operator."""
    if entered_requester(event):
        return False
    if event.reason_code == ReasonCode.MISSING_SENDER:
        return True
    if event.sender or not event.raw:
        return False
    return not parse_message(bytes(event.raw)).sender  # an event stopped before normalization stored it


def requester(event, parsed) -> Requester:
    """The person the ticket is for (see the module doc)."""
    entered = entered_requester(event)
    if entered:
        return Requester(email=entered)
    sender = Requester(email=parsed.sender, name=parsed.sender_name)
    if not parsed.sender or not is_agent(event.tenant, parsed.sender):
        return sender
    original = forwarded_original(parsed)
    if original is None:
        return sender
    email, name = original
    key = address_key(email)
    if not key or key == address_key(parsed.sender) or is_agent(event.tenant, email):
        return sender
    if key in own_addresses(event.tenant_id):
        return sender  # a forward of our own mail (an acknowledgment, a notification)
    if not agent_authenticated(event):
        # Anyone can write an agent's From: only an authenticated one may say whom a ticket is for (the desk
        # mails its requester).
        return sender
    return Requester(email=email, name=name, forwarded_by=parsed.sender)


def agent_authenticated(event) -> bool:
    """Do the trusted authentication results say the From address is the sender's own (as stored)?"""
    stored = type(event).objects.select_related("mailbox").defer("raw").filter(pk=event.pk).first() or event
    return sender_authentication(stored).authenticated


def comment_kind(event, parsed) -> tuple[bool, bool]:
    """(public, from_agent) for a reply added to a ticket: an agent's mail is an internal note."""
    if parsed.sender and is_agent(event.tenant, parsed.sender):
        return False, True
    return True, False


def copied(event, parsed, requester_email: str) -> tuple[str, ...]:
    """The people copied on the message, in its order, without the tenant's own addresses, the requester
    or the tenant's agents; at most `MAX_COPIED`."""
    if not parsed.recipients:
        return ()
    own = own_addresses(event.tenant_id)
    skip = {address_key(requester_email)} if requester_email else set()
    out = []
    for address in parsed.recipients:
        key = address_key(address)
        if not key or key in own or key in skip or is_agent(event.tenant, address):
            continue
        skip.add(key)
        out.append(address)
        if len(out) == MAX_COPIED:
            break
    return tuple(out)
