"""Small HTTP helpers shared by every outbound client (provider adapters here, destination adapters above)."""

import email.utils
from datetime import UTC, datetime


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: either a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - datetime.now(UTC)).total_seconds())


def json_or_empty(response) -> dict:
    """The response's JSON object, or {} when the body is not JSON or not an object."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
