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
import re
import threading
import time
from dataclasses import dataclass
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
    """The reference is outside its owner's scope (another tenant's secret, a platform secret not listed or not
    bound to the row)."""


def env_prefix(slug: str) -> str:
    return f"MAILROOM_T_{slug.upper().replace('-', '_')}_"


def allowed_forms(tenant) -> str:
    slug = getattr(tenant, "slug", "<tenant slug>")
    return ALLOWED_FORMS.format(env=env_prefix(slug)[11:-1], slug=slug,
                                dir=settings.MAILROOM_SECRETS_DIR or "<MAILROOM_SECRETS_DIR>")


# --- platform references ----------------------------------------------------------------------------

ANY_ROW = "*"
_SLUG = r"[-a-zA-Z0-9_]+"
_OWNER = re.compile(rf"\*|tenant:{_SLUG}|mailbox:{_SLUG}|destination:{_SLUG}/{_SLUG}")
_REF_SCHEMES = ("env:", "file:", "vault:")


@dataclass(frozen=True)
class PlatformRefs:
    """`MAILROOM_PLATFORM_SECRET_REFS` parsed: ref -> the owners it serves (an unbound entry: `*`), the refs listed
    without owners, and the entries that bind nothing because they do not parse."""

    bindings: dict[str, frozenset[str]]
    malformed: tuple[str, ...]
    unbound: frozenset[str] = frozenset()


def parse_platform_refs(entries) -> PlatformRefs:
    bindings: dict[str, set[str]] = {}
    malformed = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        ref, sep, binding = entry.rpartition("=")
        if not sep:
            ref, binding = entry, ""
        owners = [owner.strip() for owner in binding.split("|")] if binding.strip() else []
        if not ref.startswith(_REF_SCHEMES) or not all(_OWNER.fullmatch(owner) for owner in owners):
            malformed.append(entry)
            continue
        bindings.setdefault(ref, set()).update(owners)
    unbound = frozenset(ref for ref, owners in bindings.items() if not owners)
    return PlatformRefs({ref: frozenset(owners or {ANY_ROW}) for ref, owners in bindings.items()}, tuple(malformed),
                        unbound)


_parsed: dict = {}  # tuple(setting) -> PlatformRefs (the setting may change under tests)


def platform_bindings() -> PlatformRefs:
    key = tuple(settings.MAILROOM_PLATFORM_SECRET_REFS or ())
    parsed = _parsed.get(key)
    if parsed is None:
        parsed = _parsed[key] = parse_platform_refs(key)
    return parsed


def platform_refs() -> set[str]:
    """Every reference listed in MAILROOM_PLATFORM_SECRET_REFS (bound or not)."""
    return set(platform_bindings().bindings)


def is_platform_ref(ref: str) -> bool:
    return bool(ref) and ref in platform_bindings().bindings


def is_row(owner) -> bool:
    return hasattr(owner, "_meta")


def owner_label(owner, tenant) -> str:
    """How a binding names `owner` ("mailbox:<slug>", "destination:<tenant>/<slug>"); "" for anything else."""
    model = owner._meta.label_lower if is_row(owner) else ""
    if model == "intake.mailbox" and owner.slug:
        return f"mailbox:{owner.slug}"
    if model == "ticketing.destination" and owner.slug and tenant is not None:
        return f"destination:{tenant.slug}/{owner.slug}"
    return ""


def binding_problem(ref: str, tenant, owner) -> str:
    """Why listed platform reference `ref` may not be used by `owner` of `tenant`; "" when it may."""
    if tenant is None and not is_row(owner):
        return ""  # a platform caller (the AI proposer): every listed reference
    owners = platform_bindings().bindings[ref]
    label = owner_label(owner, tenant)
    mine = {ANY_ROW, label} | ({f"tenant:{tenant.slug}"} if tenant is not None else set())
    if owners & mine:
        return ""
    # Not which rows it is bound to: that would name other tenants' rows to whoever reads the message.
    return f"this platform secret reference is not bound to {label or 'this row'} in MAILROOM_PLATFORM_SECRET_REFS"


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


def scope_problem(ref: str, tenant, owner=None) -> str:
    """Why `owner` (a row, a label or None) of `tenant` (None: the platform) may not use `ref`; "" when it may."""
    if is_row(owner) and tenant is not None and getattr(owner, "tenant_id", None) not in (None, tenant.pk):
        return "the row belongs to another tenant"
    ai_key = settings.MAILROOM_AI_API_KEY_REF
    if ai_key and ref == ai_key and (tenant is not None or is_row(owner)):
        return "the AI key (MAILROOM_AI_API_KEY_REF) resolves only for the platform, never for a tenant's row"
    if is_platform_ref(ref):
        return binding_problem(ref, tenant, owner)
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


def ref_error(ref: str, tenant, owner=None) -> str:
    """The message `clean()` shows for a reference `owner` of `tenant` may not use ("" when it may)."""
    if not ref:
        return ""
    problem = scope_problem(ref, tenant, owner)
    if not problem:
        return ""
    label = owner_label(owner, tenant) or "<owner>"
    return (f"{problem}. Allowed: {allowed_forms(tenant)}; or a platform reference bound to this row in "
            f"MAILROOM_PLATFORM_SECRET_REFS ({ref}={label}), set by a platform operator.")


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
        _others_cache.clear()
        _parsed.clear()


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
    """(row, field, ref, problem) for each reference of `rows` (with `.tenant`) the row may not use."""
    for row in rows:
        for field in fields:
            ref = getattr(row, field)
            if ref and (problem := scope_problem(ref, row.tenant, row)):
                yield row, field, ref, problem
