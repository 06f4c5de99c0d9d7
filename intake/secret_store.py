"""Write secrets back where a reference points: OAuth tokens connected by an admin, refresh tokens a provider
rotated (docs/design.md §7 "Secrets"; reading is intake.secrets).

    file:<path>    replaced atomically: a 0600 temporary file in the same directory, fsync, os.replace, fsync
                   of the directory, so a crash leaves the old or the new secret, never half of one
    vault:<m>/<p>#<key>   KV v2: the current data is read, the key set, the whole written back (check-and-set
                   on the version read, so a concurrent writer's other keys are not lost)
    env:NAME       refused (SecretNotWritable): a process cannot change its environment for the next one, so a
                   rotated refresh token would be lost; `manage.py check` warns about OAuth mailboxes using one

The scope rules of intake.secrets apply to writes as to reads (SecretRefused: nothing written). After a write
the cached value is dropped (intake.secrets.forget), so the next resolution reads the new one. Values never
reach a log line or an audit row; an audit carries at most a short sha256 prefix.
"""

import hashlib
import json
import logging
import os
import tempfile
from datetime import datetime
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from .models import Mailbox, MailboxAudit, MailboxAuditKind
from .secrets import SecretRefused, SecretUnavailable, scope_problem, vault_client, written

logger = logging.getLogger(__name__)

__all__ = [
    "SecretNotWritable",
    "SecretRefused",
    "SecretWriteFailed",
    "digest",
    "keep_rotated_refresh_token",
    "store_oauth_tokens",
    "store_secret",
]


class SecretWriteFailed(Exception):
    """The secret could not be written (I/O error, Vault refused); the old value is still in place."""


class SecretNotWritable(SecretWriteFailed):
    """The reference's kind cannot be written (an environment variable)."""


def digest(value: str) -> str:
    """A short sha256 prefix: enough to tell two values apart in an audit row, never enough to use."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


def store_secret(ref: str, value: str, *, tenant, owner, actor: str) -> None:
    """Write `value` where `ref` points, for `owner` (a row) of `tenant`. Raises SecretRefused (out of scope),
    SecretNotWritable (env:) or SecretWriteFailed; on success the cached value is forgotten."""
    if not ref:
        raise SecretWriteFailed("no secret reference configured")
    problem = scope_problem(ref, tenant, owner)
    if problem:
        logger.warning("secret write to %s refused for tenant %s: %s", ref, getattr(tenant, "slug", "-"), problem)
        raise SecretRefused(f"secret reference refused: {problem}")
    scheme, _, target = ref.partition(":")
    if scheme == "env":
        raise SecretNotWritable("an environment variable cannot be rotated; use file: or vault:")
    if scheme == "file":
        _write_file(Path(target), value)
    elif scheme == "vault":
        _write_vault(target, value)
    else:
        raise SecretWriteFailed("a secret reference starts with env:, file: or vault:")
    written(ref, value)
    logger.info("secret %s written by %s (sha256 %s)", ref, actor, digest(value))


def _write_file(path: Path, value: str) -> None:
    real = path.resolve()  # scope_problem checked the resolved path; replace that file, not a symlink to it
    folder = real.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{real.name}.", suffix=".tmp")  # mode 0600
    except OSError as exc:
        raise SecretWriteFailed(f"secret file not writable: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(value)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, real)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)
    except OSError as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise SecretWriteFailed(f"secret file not writable: {exc.strerror}") from None


def _write_vault(target: str, value: str) -> None:
    import hvac.exceptions
    import requests

    path, sep, key = target.partition("#")
    mount, _, secret_path = path.partition("/")
    if not (sep and key and mount and secret_path):
        raise SecretWriteFailed("a vault reference is vault:<mount>/<path>#<key>")
    try:
        client = vault_client()
        try:
            current = client.secrets.kv.v2.read_secret_version(
                path=secret_path, mount_point=mount, raise_on_deleted_version=False
            )
            data = dict(((current or {}).get("data") or {}).get("data") or {})
            version = int((((current or {}).get("data") or {}).get("metadata") or {}).get("version") or 0)
        except hvac.exceptions.InvalidPath:
            data, version = {}, 0
        data[key] = value
        client.secrets.kv.v2.create_or_update_secret(path=secret_path, secret=data, mount_point=mount, cas=version)
    except SecretUnavailable as exc:
        raise SecretWriteFailed(str(exc)) from None
    except hvac.exceptions.Forbidden:
        raise SecretWriteFailed(f"vault: permission denied writing {path}") from None
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        raise SecretWriteFailed(f"vault: {type(exc).__name__} writing {path}") from None


def keep_rotated_refresh_token(
    *, mailbox: Mailbox, blob: dict, new_refresh_token: str, actor: str, provider: str
) -> bool:
    """The provider returned a refresh token other than the one we sent: write the credentials back with it
    (before the caller uses the new access token) and audit it. True when kept; False when the reference
    cannot be written (env:), which is audited and logged: the next refresh will use the old token.
    Raises SecretWriteFailed / SecretRefused when a writable reference could not be written."""
    old = str(blob.get("refresh_token") or "")
    updated = {**blob, "refresh_token": new_refresh_token}
    detail = {
        "provider": provider,
        "old_sha256": digest(old),
        "new_sha256": digest(new_refresh_token),
        "ref_kind": mailbox.credentials_ref.partition(":")[0],
    }
    kept = True
    try:
        store_secret(mailbox.credentials_ref, json.dumps(updated), tenant=mailbox.tenant, owner=mailbox, actor=actor)
    except SecretNotWritable:
        kept = False
        logger.warning(
            "mailbox %s: the provider rotated its refresh token but %s cannot be written; use a "
            "file: or vault: reference",
            mailbox.slug,
            detail["ref_kind"],
        )
    detail["kept"] = kept
    now = timezone.now()
    if kept:
        _slide_expiry(mailbox, now)
    MailboxAudit.objects.create(
        mailbox=mailbox,
        tenant_id=mailbox.tenant_id,
        kind=MailboxAuditKind.REFRESH_TOKEN_ROTATED,
        actor=actor,
        detail=detail,
        at=now,
    )
    return kept


def _slide_expiry(mailbox: Mailbox, now) -> None:
    """A rotated refresh token lives as long as the one the consent granted, from now (Microsoft's 90 days
    replace themselves on every use): the expiry moves on, so a mailbox in use is not warned about as expiring."""
    row = Mailbox.objects.filter(pk=mailbox.pk).values("oauth_expires_at", "oauth_connected_at").first() or {}
    expires, connected = row.get("oauth_expires_at"), row.get("oauth_connected_at")
    if expires is None or connected is None or expires <= connected:
        return
    moved = now + (expires - connected)
    Mailbox.objects.filter(pk=mailbox.pk).update(oauth_expires_at=moved, oauth_warned_at=None)
    mailbox.oauth_expires_at, mailbox.oauth_warned_at = moved, None


def store_oauth_tokens(mailbox: Mailbox, *, blob: dict, actor: str, scopes: str, expires_at: datetime | None) -> None:
    """Tokens an admin connected (the consent flow): written to the mailbox's `credentials_ref`, the grant's
    scopes and expiry on the mailbox, audited TOKENS_CONNECTED; a mailbox whose credentials were refused is
    polled again. Raises SecretRefused / SecretNotWritable / SecretWriteFailed (nothing changed)."""
    store_secret(mailbox.credentials_ref, json.dumps(blob), tenant=mailbox.tenant, owner=mailbox, actor=actor)
    now = timezone.now()
    with transaction.atomic():
        fields = {
            "oauth_scopes": scopes[:1000],
            "oauth_expires_at": expires_at,
            "oauth_connected_at": now,
            "oauth_connected_by": actor[:150],
            "oauth_warned_at": None,
        }
        Mailbox.objects.filter(pk=mailbox.pk).update(**fields)
        if mailbox.health == Mailbox.Health.CREDENTIALS_INVALID:
            from .channels.polling import reset_health  # polling imports the providers, which import this module

            reset_health([mailbox.pk])
            fields.update(health=Mailbox.Health.OK, health_detail="")
        for name, value in fields.items():
            setattr(mailbox, name, value)
        MailboxAudit.objects.create(
            mailbox=mailbox,
            tenant_id=mailbox.tenant_id,
            kind=MailboxAuditKind.TOKENS_CONNECTED,
            actor=actor[:150],
            detail={
                "scopes": scopes[:500],
                "refresh_token": bool(blob.get("refresh_token")),
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
            at=now,
        )
