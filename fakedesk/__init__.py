"""FakeDesk: a fault-injecting stand-in for help-desk APIs (docs/design.md §3 and §8).

It speaks Zendesk by default, and with `dialect=` (`--dialect`) the subsets of Jira Service
Management, ServiceNow, Salesforce, HubSpot, Freshdesk and a generic REST API that Mailroom's
destination adapters use (`fakedesk.dialects`, one module each, documented there); every
dialect shares the store, the fault plan, the idempotency memory and the request hooks.

Drills and tests point a `zendesk` destination at it and tell it, request by
request, to answer normally or to fail the ways a real help desk fails: rate
limits, 5xx, validation and credential errors, a connection dropped before or
after the ticket was written, a reply that arrives after the client gave up.
Everything it writes is kept in SQLite, so tickets can be counted by
`external_id` after the server (or the client under test) restarts.

Standard library only, so it runs without Django (and ships with Mailroom for drills):

    python -m fakedesk --port 8025 --db var/fakedesk.sqlite3 [--token T] [--quota-per-minute N]
    python manage.py fakedesk ...          # the same command line, inside Mailroom

or in Python (port 0: the OS picks a free port):

    desk = FakeDesk(token="T").start()
    ... desk.url ...
    desk.stop()

Steer a running desk through its control API with `fakedesk.client.DeskClient`
(the same calls whether the desk runs in this process or another). Tests get
one from the `desk` fixture of `fakedesk.pytest_plugin`, which also offers a
request hook (`desk.on_request`) to observe or answer API requests.

Modules (imports go one way: cli -> server -> handler -> desk -> store, faults):
    faults         the fault plan and how a refusing fault answers
    store          SQLite: tickets, comments, files (uploads, attachments), people, idempotency keys,
                   the request log
    desk           `Desk`: state, the idempotent write, request hooks (no HTTP)
    handler        `Handler`: the HTTP API and the control API for one Desk
    server         `FakeDesk`: a Desk bound to a port, served from a thread
    dialects       the other APIs, one Handler subclass each
    cli            `python -m fakedesk` and `manage.py fakedesk`
    client         `DeskClient`: the control API over HTTP
    pytest_plugin  the `desk` fixture (needs pytest; not imported here)

Zendesk API subset (basic auth `<anything>/token:<token>` when a token is set):
    POST /api/v2/tickets.json                  create; honours Idempotency-Key
    GET  /api/v2/tickets.json?external_id=X    list by external_id (not unique)
    GET  /api/v2/tickets/{id}.json             show
    PUT  /api/v2/tickets/{id}.json             add a comment; honours Idempotency-Key
    GET  /api/v2/tickets/{id}/comments.json    list comments
    GET  /api/v2/users/me.json                 the authenticated agent (a connection test)
    POST /api/v2/uploads.json?filename=N       an upload (raw bytes): a token a create/update comment names
    GET  /api/v2/users/search.json?query=email:A   find an end user or agent by address
    POST /api/v2/users/create_or_update.json   find or make an end user (a comment's author_id)
    GET  /api/v2/tickets/show_many.json?ids=1,2   show several (unknown ids left out)
    GET  /api/v2/incremental/tickets/cursor.json?start_time=T[&cursor=C][&per_page=N]
                                               tickets updated at or after T (epoch seconds), by
                                               cursor: tickets, after_cursor, end_of_stream

Control API (no auth):
    GET/POST /_control/plan         {"faults": ["ok", "rate_limit:2", ...],
                                     "random": {"seed": 7, "weights": {"error_500": 0.1}}}
    GET/POST /_control/idempotency  {"enabled": bool, "retention_seconds": N}
    GET/POST /_control/search_lag   {"search_lag_seconds": N}: searches see a record N s after its write
    GET/POST /_control/clock        {"advance_seconds": N}: the desk's clock moves N s ahead (the search lag,
                                    key retention and upload tokens age; a test waits without sleeping);
                                    GET {"offset_seconds": total}. Reset sets it back.
    POST /_control/revoke_sessions  expire the OAuth access tokens handed out (the next call is a 401)
    GET  /_control/tickets          every ticket with its comments, files ("attachments") and people
    GET  /_control/people           the desk's users / customers / contacts
    POST /_control/close            {"id": N}: close ticket N as an agent would (writes are refused as
                                    each dialect's API refuses them)
    GET  /_control/quota            the quota's count of admitted and refused requests (--quota-per-minute)
    GET  /_control/requests         the log of ticket-writing requests
    POST /_control/reset            forget tickets, keys, the log and the plan

Quota (`quota_per_minute`): more API requests than that in a sliding minute are answered 429 with
Retry-After, reads included, as the desks count them; each refusal is in the request log as fault "quota".

Faults (consumed one per record-writing request: create, comment, upload, attach):
    ok                        answer normally
    rate_limit:S              429, Retry-After: S seconds; nothing written
    rate_limit_date:S         429, Retry-After as an HTTP date S seconds ahead; nothing written
    unavailable_503[:S]       503 (with Retry-After: S when given); nothing written
    error_500                 500; nothing written
    reject_422                422 RecordInvalid (invalid requester email); nothing written
    unauthorized_401          401; nothing written
    drop_before_commit        close the connection without answering; nothing written
    drop_after_commit         write (and remember the key), then close without answering
    stall_before_commit:S     wait S seconds, then write and answer (the write lands late)
    stall_after_commit:S      write, wait S seconds, then answer (the client has timed out)
"""

from .cli import add_arguments, desk_from_options, main, run_until_signalled
from .client import ControlError, DeskClient
from .desk import DEFAULT_RETENTION_SECONDS, ApiRequest, Desk, WriteOutcome
from .faults import FAULT_ARGUMENTS, OK, Fault, FaultPlan, parse_fault, rejection_for
from .server import FakeDesk
from .store import TicketStore, ValidationFailed

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "FAULT_ARGUMENTS",
    "OK",
    "ApiRequest",
    "ControlError",
    "Desk",
    "DeskClient",
    "FakeDesk",
    "Fault",
    "FaultPlan",
    "TicketStore",
    "ValidationFailed",
    "WriteOutcome",
    "add_arguments",
    "desk_from_options",
    "main",
    "parse_fault",
    "rejection_for",
    "run_until_signalled",
]
