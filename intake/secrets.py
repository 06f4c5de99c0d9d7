"""Resolve secret references. The database only ever holds the reference (docs/design.md §7 "Secrets").

Forms: `env:NAME`, `file:/path`, `vault:<mount>/<path>#<key>` (Vault/OpenBao KV v2). A tenant's row may
only name the tenant's own secrets:

    env:MAILROOM_T_<SLUG>_<NAME>                 <SLUG>: the tenant slug in capitals, "-" as "_"
    file:<MAILROOM_SECRETS_DIR>/<slug>/<file>    the resolved path (symlinks followed, no "..") stays inside
    vault:<mount>/mailroom/<slug>/<path>#<key>

Anything else only if it is listed, exactly, in `MAILROOM_PLATFORM_SECRET_REFS` (the demo's secret, a
reference a superuser sets). `resolve_secret(ref, tenant=...)` checks this every time, so a row forced into
the database past `clean()` gains nothing; `tenant=None` (a platform caller: the AI key) allows only the
list.

Vault values are cached per process for `MAILROOM_SECRET_CACHE_SECONDS`; `forget(ref)` drops the cached
value so the next resolution re-reads it (a destination or provider that refused our credentials does
this once before failing). Every resolution is recorded in `SecretResolution` (reference, owner, outcome,
when; never the value), at most once per TTL per reference, owner and outcome; a re-read always.
"""
import hashlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

logger = logging.getLogger(__name__)

ALLOWED_FORMS = ("env:MAILROOM_T_{env}_<NAME>, file:{dir}/{slug}/<file>, "
                 "or vault:<mount>/mailroom/{slug}/<path>#<key>")
_ENV_NAME = re.compile(r"[A-Z0-9_]+")


class SecretUnavailable(Exception):
    """The reference is malformed, refused, or points at nothing."""


class SecretRefused(SecretUnavailable):
    """The reference is outside its owner's scope (another tenant's secret, a platform secret not listed)."""


def env_prefix(slug: str) -> str:
    return f"MAILROOM_T_{slug.upper().replace('-', '_')}_"


def allowed_forms(tenant) -> str:
    slug = getattr(tenant, "slug", "<tenant slug>")
    return ALLOWED_FORMS.format(env=env_prefix(slug)[11:-1], slug=slug,
                                dir=settings.MAILROOM_SECRETS_DIR or "<MAILROOM_SECRETS_DIR>")


def platform_refs() -> set[str]:
    return {ref for ref in settings.MAILROOM_PLATFORM_SECRET_REFS if ref}


def _ttl() -> float:
    return float(settings.MAILROOM_SECRET_CACHE_SECONDS)


# --- scope ------------------------------------------------------------------------------------------

_others_cache: dict = {}  # (tenant pk, slug) -> (expires, [other tenants' env prefixes that extend ours])


def _overlapping_prefixes(tenant) -> list[str]:
    """Env prefixes of other tenants that start with this tenant's ("acme" vs "acme-eu", "a-b" vs "a_b")."""
    key, now = (tenant.pk, tenant.slug), time.monotonic()
    cached = _others_cache.get(key)
    if cached and cached[0] > now:
        return cached[1]
    pattern = "^" + "".join("[-_]" if c in "-_" else re.escape(c) for c in tenant.slug) + "([-_].*)?$"
    slugs = type(tenant)._default_manager.exclude(pk=tenant.pk).filter(slug__iregex=pattern).values_list(
        "slug", flat=True)
    prefixes = [env_prefix(slug) for slug in slugs]
    _others_cache[key] = (now + _ttl(), prefixes)
    return prefixes


def scope_problem(ref: str, tenant) -> str:
    """Why `tenant` (None: the platform) may not use `ref`; "" when it may."""
    if ref in platform_refs():
        return ""
    if tenant is None:
        return "a platform secret reference must be listed in MAILROOM_PLATFORM_SECRET_REFS"
    scheme, _, target = ref.partition(":")
    if scheme == "env":
        prefix = env_prefix(tenant.slug)
        if not (_ENV_NAME.fullmatch(target) and target.startswith(prefix) and len(target) > len(prefix)):
            return f"the variable must be named {prefix}<NAME>"
        if any(target.startswith(other) for other in _overlapping_prefixes(tenant)):
            return "the variable belongs to another tenant's namespace"
        return ""
    if scheme == "file":
        base = settings.MAILROOM_SECRETS_DIR
        if not base:
            return "file references need MAILROOM_SECRETS_DIR to be set"
        path = Path(target)
        if not path.is_absolute() or ".." in path.parts:
            return "the file must be an absolute path without '..'"
        folder = (Path(base) / tenant.slug).resolve()
        real = path.resolve()
        if real == folder or not real.is_relative_to(folder):
            return f"the file must be inside {folder}/"
        return ""
    if scheme == "vault":
        path, sep, key = target.partition("#")
        parts = path.split("/")
        if (not sep or not key or len(parts) < 4 or any(p in ("", ".", "..") for p in parts)
                or parts[1] != "mailroom" or parts[2] != tenant.slug):
            return f"the vault path must be <mount>/mailroom/{tenant.slug}/<path>#<key>"
        return ""
    return "a secret reference starts with env:, file: or vault:"


def ref_error(ref: str, tenant) -> str:
    """The message `clean()` shows for a reference `tenant` may not use ("" when it may)."""
    if not ref:
        return ""
    problem = scope_problem(ref, tenant)
    if not problem:
        return ""
    return (f"{problem}. Allowed: {allowed_forms(tenant)}; or a reference listed in "
            "MAILROOM_PLATFORM_SECRET_REFS.")


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


def clear_cache() -> None:
    with _lock:
        _values.clear()
        _reread.clear()
        _recorded.clear()
        _digests.clear()
        _others_cache.clear()


def reread(ref: str, *, tenant, owner=None) -> bool:
    """Read `ref` again, bypassing the cache (after a credentials refusal): True when the value differs from
    the one this process read before. Raises SecretUnavailable like `resolve_secret`."""
    before = _digests.get(ref)
    forget(ref)
    resolve_secret(ref, tenant=tenant, owner=owner)
    return _digests.get(ref) != before


def resolve_secret(ref: str, *, tenant, owner=None) -> str:
    """The secret `ref` names, for `tenant` (the owner's tenant; None for a platform caller).

    `owner` (a Mailbox, a Destination or a label) is only recorded. Raises SecretUnavailable
    (SecretRefused when the reference is outside the tenant's scope: nothing is read).
    """
    if not ref:
        raise SecretUnavailable("no secret reference configured")
    with _lock:
        fresh = ref in _reread
        _reread.discard(ref)
    problem = scope_problem(ref, tenant)
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
            _values[ref] = (now + _ttl(), value)
        return value
    raise SecretUnavailable("a secret reference starts with env:, file: or vault:")


def _record(ref: str, tenant, owner, outcome: str, fresh: bool) -> None:
    if hasattr(owner, "_meta") and owner.pk is None:
        return  # an unsaved row (an adapter tried out on a form): nothing to point at
    owner_label = f"{owner._meta.model_name}:{owner.pk}" if hasattr(owner, "_meta") else str(owner or "")
    key, now = (ref, owner_label, outcome), time.monotonic()
    with _lock:
        last = _recorded.get(key)
        if not fresh and last is not None and now - last < _ttl():
            return
        _recorded[key] = now
    from .models import SecretResolution

    try:
        with transaction.atomic():
            SecretResolution.objects.create(ref=ref[:300], tenant_id=getattr(tenant, "pk", None), owner=owner_label,
                                            outcome=outcome, fresh=fresh, at=timezone.now())
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
            response = client.secrets.kv.v2.read_secret_version(path=secret_path, mount_point=mount,
                                                                raise_on_deleted_version=True)
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
    """(row, field, ref, problem) for each reference of `rows` (with `.tenant`) outside its tenant's scope."""
    for row in rows:
        for field in fields:
            ref = getattr(row, field)
            if ref and (problem := scope_problem(ref, row.tenant)):
                yield row, field, ref, problem
