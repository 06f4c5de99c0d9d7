"""Sender block and allow lists: adding and removing entries (services) and reading them (selectors).

    add_sender_list_entry(tenant=, mailbox=, kind=, pattern=, actor=, note="") -> SenderListEntry
    remove_sender_list_entry(entry=, actor=) -> None
    visible_sender_list_entries(user) -> QuerySet
    sender_list_entry_for(event, sender) -> ListEntry | None      (normalization: one indexed query, or
                                                                  one per task group: intake.groupcache)

What an entry means and which one decides: `intake.validation.sender_lists`. Every write checks that the
actor may manage the tenant (`visible_tenants`: a member, or a superuser) and that the mailbox, if any, is
that tenant's; forms and the API only call these.
"""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from . import groupcache
from .logging import mask_address
from .models import Mailbox, SenderListEntry, Tenant
from .selectors import visible_tenants
from .validation.sender_lists import MAILBOX, TENANT, ListEntry, deciding_entry, lookup_keys, normalize_pattern

logger = logging.getLogger(__name__)
audit_log = logging.getLogger("mailroom.audit")

MANAGE_PERMISSION = "intake.add_senderlistentry"


def visible_sender_list_entries(user) -> QuerySet:
    """The entries of the tenants the user may see (a superuser: all)."""
    return SenderListEntry.objects.filter(tenant__in=visible_tenants(user).values("pk")).select_related(
        "tenant", "mailbox"
    )


def _check_scope(actor, tenant: Tenant, mailbox: Mailbox | None) -> None:
    if actor is None or not visible_tenants(actor).filter(pk=tenant.pk).exists():
        raise PermissionDenied("you do not manage this tenant's sender lists")
    if mailbox is not None and not visible_tenants(actor).filter(pk=mailbox.tenant_id).exists():
        raise PermissionDenied("you do not manage this mailbox's tenant")
    if mailbox is not None and mailbox.tenant_id != tenant.pk:
        raise ValidationError({"mailbox": "This mailbox belongs to another tenant."})


def add_sender_list_entry(
    *, tenant: Tenant, mailbox: Mailbox | None, kind: str, pattern: str, actor, note: str = ""
) -> SenderListEntry:
    """A new entry on the tenant's list (`mailbox` None) or the mailbox's. PermissionDenied outside the actor's
    tenants; ValidationError for a bad kind or pattern, or one already on that list."""
    _check_scope(actor, tenant, mailbox)
    if kind not in SenderListEntry.Kind.values:
        raise ValidationError({"kind": f"kind must be one of {', '.join(SenderListEntry.Kind.values)}"})
    try:
        normalized = normalize_pattern(pattern)
    except ValueError as exc:
        raise ValidationError({"pattern": str(exc)}) from None
    entry = SenderListEntry(
        tenant=tenant,
        mailbox=mailbox,
        kind=kind,
        pattern=normalized,
        note=(note or "")[:200],
        created_by=actor.get_username()[:150],
    )
    try:
        with transaction.atomic():
            entry.save()
    except IntegrityError:
        where = f"mailbox {mailbox.slug}'s" if mailbox is not None else "the tenant's"
        raise ValidationError({"pattern": f"{normalized} is already on {where} list"}) from None
    logger.info(
        "sender list: %s %s added to tenant %s%s by %s",
        kind,
        mask_address(normalized),
        tenant.slug,
        f" mailbox {mailbox.slug}" if mailbox else "",
        actor.get_username(),
    )
    return entry


def remove_sender_list_entry(*, entry: SenderListEntry, actor) -> None:
    """Take `entry` off its list. PermissionDenied outside the actor's tenants. Unblocking a sender is a
    decision someone may ask about later: it is logged on `mailroom.audit` (who, what kind, the masked entry)."""
    _check_scope(actor, entry.tenant, None)
    entry.delete()
    audit_log.warning(
        "sender list: %s %s removed from tenant %s%s by %s",
        entry.kind,
        mask_address(entry.pattern),
        entry.tenant.slug,
        f" mailbox {entry.mailbox.slug}" if entry.mailbox_id else "",
        actor.get_username(),
    )


# A tenant with more entries than this is read per event (one indexed query) even inside a task's group.
GROUP_LOAD_LIMIT = 500


def sender_list_entry_for(event, sender: str) -> ListEntry | None:
    """The entry that decides for `sender` on `event`'s mailbox (its list, then the tenant's), or None.

    Inside a task's group scope (`intake.groupcache`) a tenant's entries are read once for the group when
    there are at most GROUP_LOAD_LIMIT of them; the same match is then made in memory."""
    keys = lookup_keys(sender)
    if not keys:
        return None
    loaded = (
        groupcache.remembered(("sender_lists", event.tenant_id), lambda: _all_entries(event.tenant_id))
        if groupcache.active()
        else None
    )
    if loaded is None:
        rows = (
            SenderListEntry.objects.filter(tenant_id=event.tenant_id, pattern__in=keys)
            .filter(Q(mailbox__isnull=True) | Q(mailbox_id=event.mailbox_id))
            .values_list("pk", "kind", "pattern", "mailbox_id")
        )
    else:
        wanted = set(keys)
        rows = [row for row in loaded if row[2] in wanted and row[3] in (None, event.mailbox_id)]
    entries = [
        ListEntry(kind, pattern, MAILBOX if mailbox_id else TENANT, pk) for pk, kind, pattern, mailbox_id in rows
    ]
    return deciding_entry(sender, entries)


def _all_entries(tenant_id: int) -> list[tuple] | None:
    """Every entry of the tenant as (pk, kind, pattern, mailbox_id), or None when there are too many."""
    rows = list(
        SenderListEntry.objects.filter(tenant_id=tenant_id).values_list("pk", "kind", "pattern", "mailbox_id")[
            : GROUP_LOAD_LIMIT + 1
        ]
    )
    return None if len(rows) > GROUP_LOAD_LIMIT else rows
