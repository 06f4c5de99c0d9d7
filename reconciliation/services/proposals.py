"""The AI proposer's suggestion on an item sent to review for low confidence: show it, accept it.

Classification stores the proposal in `InboxEvent.route["ai"]` as
`{"fields": {...}, "confidence": x, "rationale": "...", "failure": ""}`. Accepting it
is a route correction made by the operator (`do_correct_and_replay`): the proposed
fields, over the fields rules already set, replayed under the original key; the
`replayed` audit row names the operator and the route.
"""

from intake.models import InboxEvent
from intake.vocabulary import ReasonCode
from ticketing.models import PRIORITIES, RoutingPolicy

from .access import ActionRefused, require, visible_event
from .queue_actions import do_correct_and_replay
from .roles import PERM_REPLAY

LOW_CONFIDENCE = ReasonCode.LOW_CONFIDENCE  # the recovery reason of the contracts (§8)
PROPOSAL_FIELDS = ("queue", "priority", "request_type")


def stored_proposal(event: InboxEvent) -> dict | None:
    """The usable proposal on an item awaiting review for low confidence, else None."""
    if event.state != InboxEvent.State.AWAITING_REVIEW or event.reason_code != LOW_CONFIDENCE:
        return None
    ai = (event.route or {}).get("ai")
    if not isinstance(ai, dict) or ai.get("failure"):
        return None
    fields = ai.get("fields")
    if not isinstance(fields, dict):
        return None
    fields = {k: str(v) for k, v in fields.items() if k in PROPOSAL_FIELDS and v}
    if not fields:
        return None
    confidence = ai.get("confidence")
    return {
        "fields": fields,
        "confidence": confidence if isinstance(confidence, int | float) else None,
        "rationale": str(ai.get("rationale") or "")[:500],
    }


def _route_fields(event: InboxEvent) -> dict:
    """The fields classification already chose (rules, defaults): `route["fields"][name]["value"]`."""
    chosen = (event.route or {}).get("fields") or {}
    values = {}
    for name in PROPOSAL_FIELDS:
        entry = chosen.get(name)
        value = entry.get("value") if isinstance(entry, dict) else entry
        if value:
            values[name] = str(value)
    return values


def do_accept_proposal(user, event_id: int) -> str:
    """Replay the item with the stored proposal as its corrected route; the outcome of the replay."""
    require(user, PERM_REPLAY)
    event = visible_event(user, event_id)
    proposal = stored_proposal(event)
    if proposal is None:
        raise ActionRefused(
            "no AI proposal to accept: the item is not awaiting review for low confidence with a usable proposal"
        )
    policy = RoutingPolicy.objects.filter(tenant_id=event.tenant_id).first()
    vocab = {
        "queue": policy.queues if policy else [],
        "priority": PRIORITIES,
        "request_type": policy.request_types if policy else [],
    }
    for name, value in proposal["fields"].items():
        if value not in vocab[name]:
            raise ActionRefused(f"the proposed {name} {value!r} is no longer in the tenant's vocabulary")
    override = {k: v for k, v in (event.route_override or {}).items() if k in PROPOSAL_FIELDS and v}
    route = {**_route_fields(event), **override, **proposal["fields"]}
    destination_id = (event.route_override or {}).get("destination_id") or (event.route or {}).get("destination_id")
    return do_correct_and_replay(user, event.pk, destination_id=destination_id, **route)
