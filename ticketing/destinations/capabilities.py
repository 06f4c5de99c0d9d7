"""What a destination kind does with what a message carries, declared once per adapter class
(`DestinationAdapter.capabilities`) and read by the pipeline: which files go, how, and up to which size;
whether the body goes as HTML; how the requester and the CC'd people are found; who a reply is written
as; what a reply to a closed ticket becomes; whether the desk acknowledges by itself; its request quota.
`docs/destinations/<kind>.md` says the same for people; `tests/test_capabilities.py` keeps the two honest.
"""

from dataclasses import dataclass

MB = 1024 * 1024

# How files reach the desk.
FILES_NONE = "none"  # nothing: the description lists them
FILES_WITH_WRITE = "with_write"  # in the create/comment call itself (multipart, or upload tokens made first)
FILES_AFTER_WRITE = "after_write"  # one call per file on the record, after it exists (an `attach_files` intent)

# How the requester is named.
REQUESTER_ADDRESS = "address"  # an address (and name) in a field; the desk keeps it as text
REQUESTER_FIND_OR_CREATE = "find_or_create"  # the desk's own customer/user/contact, found by address or made

# What a reply to a closed ticket may become (a destination's `closed_policy` setting).
FOLLOW_UP = "follow_up"  # a new ticket linked to the closed one (Zendesk's via_followup_source_id)
REOPEN = "reopen"  # the comment goes on and reopens it, where the desk allows that
REVIEW = "review"  # a person decides (recovery queue, reason ticket_closed)
CLOSED_POLICIES = (FOLLOW_UP, REOPEN, REVIEW)


@dataclass(frozen=True)
class Capabilities:
    files: str = FILES_NONE
    max_file_bytes: int = 20 * MB  # a larger file is held back and listed (the desk's documented limit)
    max_files: int = 50  # per ticket or comment; the rest are listed
    html: bool = False  # the desk takes an HTML body (sanitized, inline images resolved)
    requester: str = REQUESTER_ADDRESS
    # Where CC'd addresses go, in the desk's words ("email_ccs", "watch_list", ...); "" = listed in the
    # description only.
    cc_field: str = ""
    # A customer's reply is authored by the customer in the desk (else a "From:" line opens the comment).
    customer_authored_comments: bool = False
    internal_notes: bool = True  # the desk has private comments (an agent's mail becomes one)
    # The closed-ticket policies the desk can carry out (`REVIEW` always works).
    closed_policies: tuple[str, ...] = (REVIEW,)
    # The desk mails the requester when a ticket is made: Mailroom's own acknowledgment is off by default.
    acknowledges_requester: bool = False
    # The documented request quota per minute (shared by all workers: ticketing.budget); None: unlimited.
    requests_per_minute: int | None = None

    @property
    def default_closed_policy(self) -> str:
        return FOLLOW_UP if FOLLOW_UP in self.closed_policies else REVIEW
