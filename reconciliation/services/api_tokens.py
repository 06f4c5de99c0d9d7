"""REST API tokens: made for a user, stored as a SHA-256 hash only, looked up by that hash; each may expire.

Who may do what (checked here, so the console and `manage.py api_token` refuse alike): a user issues tokens for
themselves; only a superuser issues one for someone else (the roles, `roles.ROLE_PERMISSIONS`, grant no one
that: a token carries every permission of its owner). A token is revoked by its owner or a superuser. Each
issue and revoke leaves a LogEntry naming the token by its prefix, never the token; nothing logs the token.
"""

import hashlib
import logging
import secrets
from datetime import datetime, timedelta

from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from ..models import ApiToken
from .access import actor_name

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "mr_"
PREFIX_CHARS = 10  # stored in clear ("mr_" and 7 random characters): tells tokens apart, proves nothing
# What the console offers (days; None: never). A token that never expires is a choice, said as such.
EXPIRY_CHOICES = ((30, "30 days"), (7, "7 days"), (90, "90 days"), (365, "1 year"), (None, "never"))
MAX_EXPIRY_DAYS = 3650
ISSUE_REFUSED = "only a superuser issues API tokens for someone else; issue your own"
REVOKE_REFUSED = "only the token's owner or a superuser revokes it"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def may_issue_for(actor, owner) -> bool:
    if actor is None or not actor.is_active or owner is None or not owner.is_active:
        return False
    return actor.pk == owner.pk or actor.is_superuser


def may_revoke(actor, token: ApiToken) -> bool:
    return actor is not None and actor.is_active and (actor.is_superuser or token.user_id == actor.pk)


def visible_tokens(user):
    """The tokens `user` may see and revoke: their own; a superuser's, everyone's."""
    rows = ApiToken.objects.select_related("user").order_by("-created_at", "-pk")
    return rows if user.is_superuser else rows.filter(user_id=user.pk)


def _log(actor, token: ApiToken, flag: int, message: str) -> None:
    LogEntry.objects.create(
        user_id=actor.pk,
        content_type=ContentType.objects.get_for_model(ApiToken),
        object_id=str(token.pk),
        object_repr=str(token)[:200],
        action_flag=flag,
        change_message=message,
    )


def do_issue_api_token(user, *, owner=None, name: str = "", expires_in_days: int | None = None) -> str:
    """A new token for `owner` (default: `user` themselves), issued by `user`; returned once for the caller to
    show (only its hash is kept). `expires_in_days`: refused from then on; None: never."""
    owner = owner or user
    if not may_issue_for(user, owner):
        raise PermissionDenied(ISSUE_REFUSED)
    name = " ".join(str(name or "").split())
    if len(name) > ApiToken._meta.get_field("name").max_length:
        raise ValidationError({"name": "at most 100 characters"})
    expires_at: datetime | None = None
    if expires_in_days is not None:
        if (
            isinstance(expires_in_days, bool)
            or not isinstance(expires_in_days, int)
            or not 1 <= expires_in_days <= MAX_EXPIRY_DAYS
        ):
            raise ValidationError({"expires_in_days": f"a whole number of days from 1 to {MAX_EXPIRY_DAYS}"})
        expires_at = timezone.now() + timedelta(days=expires_in_days)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        row = ApiToken.objects.create(
            user=owner,
            key_hash=hash_token(token),
            prefix=token[:PREFIX_CHARS],
            name=name,
            created_at=timezone.now(),
            expires_at=expires_at,
        )
        _log(
            user,
            row,
            ADDITION,
            f"API token {row.prefix}… issued for {owner.get_username()}"
            f"{f' ({name})' if name else ''}, "
            f"{'expires ' + expires_at.strftime('%Y-%m-%d') if expires_at else 'never expires'}",
        )
    logger.info("API token %s issued for %s by %s", row.prefix, owner.get_username(), actor_name(user))
    return token


def do_revoke_api_token(user, *, token_id: int) -> ApiToken:
    """Delete the token (its owner or a superuser); ApiToken.DoesNotExist (a 404) for one the user cannot see."""
    token = visible_tokens(user).get(pk=token_id)
    if not may_revoke(user, token):
        raise PermissionDenied(REVOKE_REFUSED)
    with transaction.atomic():
        _log(user, token, DELETION, f"API token {token.prefix}… of {token.user.get_username()} revoked")
        ApiToken.objects.filter(pk=token.pk).delete()
    logger.info("API token %s revoked by %s", token.prefix, actor_name(user))
    return token


def is_expired(token: ApiToken, now=None) -> bool:
    return token.expires_at is not None and token.expires_at <= (now or timezone.now())


def user_for_token(token: str):
    """(user, ApiToken) for a valid, unexpired token of an active user, else None. Records when it was last
    used."""
    row = ApiToken.objects.select_related("user").filter(key_hash=hash_token(token or "")).first()
    now = timezone.now()
    if row is None or not row.user.is_active or is_expired(row, now):
        return None
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    row.last_used_at = now
    return row.user, row
