"""Changes to a destination that deserve a trace outside the inbox events' audit trail.

A destination's `base_url` is where its credentials are sent. Who may change it is the secret rule's
(intake.secret_policy: not on a row holding a platform reference; to another host only with the credentials
reference entered again). When someone other than a superuser changes it, through the admin or the API, an
admin `LogEntry` (the destination's history: who, when, old and new host) and a WARNING on the
`mailroom.audit` logger are written. `AuditEvent` is not used: it belongs to an inbox event.
"""

import logging
from urllib.parse import urlsplit

from django.contrib.admin.models import CHANGE, LogEntry

audit_log = logging.getLogger("mailroom.audit")


def _host(url: str) -> str:
    return urlsplit(url or "").netloc or "(none)"


def base_url_changed(user, destination, old_url: str) -> bool:
    """Record `user`'s change of `destination.base_url` from `old_url` (after the save). False if not recorded:
    unchanged, or changed by a superuser."""
    if (old_url or "") == (destination.base_url or "") or getattr(user, "is_superuser", False):
        return False
    message = (
        f"base_url changed by non-superuser {user.get_username()}: host {_host(old_url)} -> "
        f"{_host(destination.base_url)} ({old_url or '-'} -> {destination.base_url or '-'})"
    )
    LogEntry.objects.log_actions(user.pk, [destination], CHANGE, change_message=message, single_object=True)
    audit_log.warning("destination %s (tenant %s): %s", destination.pk, destination.tenant_id, message)
    return True
