"""REST API tokens: made for a user, stored as a SHA-256 hash only, looked up by that hash."""
import hashlib
import secrets

from django.utils import timezone

from ..models import ApiToken

TOKEN_PREFIX = "mr_"
PREFIX_CHARS = 10  # stored in clear ("mr_" and 7 random characters): tells tokens apart, proves nothing


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def do_issue_api_token(user) -> str:
    """A new token for `user`; the caller shows it once (only its hash is kept)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, key_hash=hash_token(token), prefix=token[:PREFIX_CHARS],
                            created_at=timezone.now())
    return token


def user_for_token(token: str):
    """(user, ApiToken) for a valid token of an active user, else None. Records when it was last used."""
    row = ApiToken.objects.select_related("user").filter(key_hash=hash_token(token or "")).first()
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    row.last_used_at = now
    return row.user, row
