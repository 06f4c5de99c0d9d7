"""Resolve secret references. The database only ever holds the reference (docs/design.md §7 "Secrets").

Forms: `env:NAME`, `file:/path`, `vault:<mount>/<path>#<key>` (Vault/OpenBao KV v2). A tenant's row may
only name the tenant's own secrets:

    env:MAILROOM_T_<SLUG>_<NAME>                 <SLUG>: the tenant slug in capitals, "-" as "_"
    file:<MAILROOM_SECRETS_DIR>/<slug>/<file>    the resolved path (symlinks followed, no "..") stays inside
    vault:<mount>/mailroom/<slug>/<path>#<key>

Anything else is a platform reference: it must be listed in `MAILROOM_PLATFORM_SECRET_REFS` (comma-separated),
and a row may use it only if the entry binds it to that row:

    <ref>=<owner>[|<owner>...]      only for the rows named; an owner is
                                    mailbox:<mailbox slug>, destination:<tenant slug>/<slug>,
                                    tenant:<slug> (any row of that tenant), or * (any row)
    <ref>                           unbound: any row a superuser points at it (as before bindings existed,
                                    the contract's plain list); `manage.py check` asks to bind it in production

The binding is what follows the entry's LAST "=" (owners never contain "="), so a reference may contain ":",
"/", "#" or "|"; one that contains "=" ends its entry with "=" (unbound) or "=<owners>". An entry whose
binding does not parse binds nothing (`manage.py check` names it). A listed reference is a platform
reference even if it looks like a tenant's own: the list decides. `MAILROOM_AI_API_KEY_REF` resolves only
for the platform, whatever its entry says. Who may SET a platform reference on a row: intake.secret_policy.

`resolve_secret(ref, tenant=..., owner=row)` checks all this every time, so a row forced into the database
past `clean()` gains nothing (SecretRefused, recorded `refused`, nothing read).

Vault values are cached per process for `MAILROOM_SECRET_CACHE_SECONDS`; `forget(ref)` drops the cached
value so the next resolution re-reads it (a destination or provider that refused our credentials does
this once before failing). Every resolution is recorded in `SecretResolution` (reference, owner, outcome,
when; never the value), at most once per TTL per reference, owner and outcome; a re-read always.
"""

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from django.db import DatabaseError, transaction
from django.utils import timezone

from .models import SecretResolution
from .secret_scope import (  # noqa: F401  (the scope rules: re-exported, callers import them from here)
    ALLOWED_FORMS,
    ANY_ROW,
    PlatformRefs,
    allowed_forms,
    binding_problem,
    cache_ttl,
    clear_scope_cache,
    env_prefix,
    is_platform_ref,
    is_row,
    owner_label,
    parse_platform_refs,
    platform_bindings,
    platform_refs,
    ref_error,
    scope_problem,
)

logger = logging.getLogger(__name__)


class SecretUnavailable(Exception):
    """The reference is malformed, refused, or points at nothing."""


class SecretRefused(SecretUnavailable):
    """The reference is outside its owner's scope (another tenant's secret, a platform secret not listed or not
    bound to the row)."""


# --- reading ----------------------------------------------------------------------------------------

_lock = threading.Lock()
_values: dict = {}  # vault ref -> (expires, value)
_reread: set = set()  # refs whose next resolution is a forced re-read
_recorded: dict = {}  # (ref, owner, outcome) -> monotonic time of the last record
_digests: dict = {}  # ref -> sha256 of the value last read (to tell whether a re-read found a new one)


def forget(ref: str) -> None:
    """Drop the cached value: the next resolution of `ref` reads the source again (and is recorded)."""
    with _lock:
        _values.pop(ref, None)
        _reread.add(ref)


def written(ref: str, value: str) -> None:
    """We wrote `value` to `ref` ourselves (intake.secret_store): the next resolution reads it again, and a
    re-read after a refusal does not count our own write as "a new secret" (`reread`)."""
    forget(ref)
    _digests[ref] = hashlib.sha256(value.encode()).hexdigest()


def clear_cache() -> None:
    with _lock:
        _values.clear()
        _reread.clear()
        _recorded.clear()
        _digests.clear()
    clear_scope_cache()


def reread(ref: str, *, tenant, owner=None) -> bool:
    """Read `ref` again, bypassing the cache (after a credentials refusal): True when the value differs from
    the one this process read before. Raises SecretUnavailable like `resolve_secret`."""
    before = _digests.get(ref)
    forget(ref)
    resolve_secret(ref, tenant=tenant, owner=owner)
    return _digests.get(ref) != before


def resolve_secret(ref: str, *, tenant, owner=None) -> str:
    """The secret `ref` names, for `owner` of `tenant` (the owner's tenant; None for a platform caller).

    `owner` (a Mailbox, a Destination or a label) is recorded, and is what a platform reference must be bound
    to. Raises SecretUnavailable (SecretRefused when the reference is outside the row's scope: nothing is read).
    """
    if not ref:
        raise SecretUnavailable("no secret reference configured")
    with _lock:
        fresh = ref in _reread
        _reread.discard(ref)
    problem = scope_problem(ref, tenant, owner)
    if problem:
        _record(ref, tenant, owner, "refused", fresh)
        logger.warning("secret reference %s refused for tenant %s: %s", ref, getattr(tenant, "slug", "-"), problem)
        raise SecretRefused(f"secret reference refused: {problem}")
    try:
        value = _read(ref, fresh)
    except SecretUnavailable:
        _record(ref, tenant, owner, "unavailable", fresh)
        raise
    _digests[ref] = hashlib.sha256(value.encode()).hexdigest()
    _record(ref, tenant, owner, "ok", fresh)
    return value


def resolution_problem(ref: str, *, tenant, owner=None) -> str:
    """Why `ref` does not resolve right now ("environment variable X is not set"), or "" when it does (or is
    empty). For a warning when a row is saved: the text never carries the value."""
    if not ref:
        return ""
    try:
        resolve_secret(ref, tenant=tenant, owner=owner)
    except SecretUnavailable as exc:
        return str(exc)
    return ""


def _read(ref: str, fresh: bool) -> str:
    scheme, _, target = ref.partition(":")
    if scheme == "env":
        value = os.environ.get(target)
        if value is None:
            raise SecretUnavailable(f"environment variable {target} is not set")
        return value
    if scheme == "file":
        try:
            fd = os.open(Path(target).resolve(), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as handle:
                return handle.read().strip()
        except OSError as exc:
            raise SecretUnavailable(f"secret file unreadable: {exc.strerror}") from None
    if scheme == "vault":
        now = time.monotonic()
        cached = None if fresh else _values.get(ref)
        if cached and cached[0] > now:
            return cached[1]
        value = _read_vault(target)
        with _lock:
            _values[ref] = (now + cache_ttl(), value)
        return value
    raise SecretUnavailable("a secret reference starts with env:, file: or vault:")


def _record(ref: str, tenant, owner, outcome: str, fresh: bool) -> None:
    if hasattr(owner, "_meta") and owner.pk is None:
        return  # an unsaved row (an adapter tried out on a form): nothing to point at
    label = f"{owner._meta.model_name}:{owner.pk}" if hasattr(owner, "_meta") else str(owner or "")
    key, now = (ref, label, outcome), time.monotonic()
    with _lock:
        last = _recorded.get(key)
        if not fresh and last is not None and now - last < cache_ttl():
            return
        _recorded[key] = now
    try:
        with transaction.atomic():
            SecretResolution.objects.create(
                ref=ref[:300],
                tenant_id=getattr(tenant, "pk", None),
                owner=label,
                outcome=outcome,
                fresh=fresh,
                at=timezone.now(),
            )
    except (DatabaseError, RuntimeError) as exc:  # RuntimeError: no database access (a unit test)
        logger.warning("could not record the resolution of %s: %s", ref, type(exc).__name__)


# --- Vault / OpenBao KV v2 --------------------------------------------------------------------------

_vault_clients: dict = {}


def _vault_client(relogin: bool = False):
    import hvac

    addr = os.environ.get("VAULT_ADDR") or os.environ.get("BAO_ADDR")
    if not addr:
        raise SecretUnavailable("vault: VAULT_ADDR (or BAO_ADDR) is not set")
    token = os.environ.get("VAULT_TOKEN") or os.environ.get("BAO_TOKEN")
    role_id, secret_id = os.environ.get("VAULT_ROLE_ID"), os.environ.get("VAULT_SECRET_ID")
    key = (addr, token, role_id, secret_id)
    client = None if relogin else _vault_clients.get(key)
    if client is None:
        client = hvac.Client(url=addr, token=token or None, timeout=5)
        if not token:
            if not (role_id and secret_id):
                raise SecretUnavailable("vault: set VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID")
            client.auth.approle.login(role_id=role_id, secret_id=secret_id)
        _vault_clients.clear()
        _vault_clients[key] = client
    return client


def vault_client(*, relogin: bool = False):
    """The process's Vault/OpenBao client (VAULT_ADDR, VAULT_TOKEN or AppRole), for writers such as
    intake.secret_store; SecretUnavailable when Vault is not configured."""
    return _vault_client(relogin=relogin)


def _read_vault(target: str) -> str:
    import hvac.exceptions
    import requests

    path, sep, key = target.partition("#")
    mount, _, secret_path = path.partition("/")
    if not (sep and key and mount and secret_path):
        raise SecretUnavailable("a vault reference is vault:<mount>/<path>#<key>")
    for attempt in (1, 2):
        try:
            client = _vault_client(relogin=attempt == 2)
            response = client.secrets.kv.v2.read_secret_version(
                path=secret_path, mount_point=mount, raise_on_deleted_version=True
            )
            break
        except hvac.exceptions.InvalidPath:
            raise SecretUnavailable(f"vault: no secret at {path}") from None
        except hvac.exceptions.Forbidden:
            if attempt == 2 or os.environ.get("VAULT_TOKEN") or os.environ.get("BAO_TOKEN"):
                raise SecretUnavailable(f"vault: permission denied for {path}") from None
            # An AppRole token may have expired: log in again, once.
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise SecretUnavailable(f"vault: {type(exc).__name__} reading {path}") from None
    data = ((response or {}).get("data") or {}).get("data") or {}
    if key not in data:
        raise SecretUnavailable(f"vault: {path} has no key {key}")
    value = data[key]
    return value if isinstance(value, str) else json.dumps(value)


def out_of_scope(rows, fields):
    """(row, field, ref, problem) for each reference of `rows` (with `.tenant`) the row may not use."""
    for row in rows:
        for field in fields:
            ref = getattr(row, field)
            if ref and (problem := scope_problem(ref, row.tenant, row)):
                yield row, field, ref, problem
