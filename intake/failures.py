"""The three ways an external call can fail (docs/design.md §6 "The intent state machine").

Every provider and destination adapter maps its errors to exactly one of these,
so that the state machines above them never look at an HTTP status.
"""


class ExternalCallError(Exception):
    kind = "error"

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason if not detail else f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class TransientError(ExternalCallError):
    """Nothing happened on the other side; trying again later is safe."""

    kind = "transient"

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None):
        super().__init__(reason, detail)
        self.retry_after = retry_after


class PermanentError(ExternalCallError):
    """The other side refused for a reason a retry cannot fix (bad fields, bad credentials)."""

    kind = "permanent"


class AmbiguousOutcome(ExternalCallError):
    """The request may or may not have taken effect (timeout or reset after sending)."""

    kind = "ambiguous"
