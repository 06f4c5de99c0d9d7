"""Which secret references a row may use: the tenant's own forms, the platform list and its bindings
(intake.secrets explains the forms). Pure rules over settings and the tenants table, no reading of any secret,
so that a model's clean() can ask them without importing the resolver (which records into the models)."""

import re
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

ALLOWED_FORMS = "env:MAILROOM_T_{env}_<NAME>, file:{dir}/{slug}/<file>, or vault:<mount>/mailroom/{slug}/<path>#<key>"
_ENV_NAME = re.compile(r"[A-Z0-9_]+")


def env_prefix(slug: str) -> str:
    return f"MAILROOM_T_{slug.upper().replace('-', '_')}_"


def allowed_forms(tenant) -> str:
    slug = getattr(tenant, "slug", "<tenant slug>")
    return ALLOWED_FORMS.format(
        env=env_prefix(slug)[11:-1], slug=slug, dir=settings.MAILROOM_SECRETS_DIR or "<MAILROOM_SECRETS_DIR>"
    )


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
    return PlatformRefs(
        {ref: frozenset(owners or {ANY_ROW}) for ref, owners in bindings.items()}, tuple(malformed), unbound
    )


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


def cache_ttl() -> float:
    """How long a resolved value or a scope lookup is kept (MAILROOM_SECRET_CACHE_SECONDS)."""
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
    slugs = (
        type(tenant)._default_manager.exclude(pk=tenant.pk).filter(slug__iregex=pattern).values_list("slug", flat=True)
    )
    prefixes = [env_prefix(slug) for slug in slugs]
    _others_cache[key] = (now + cache_ttl(), prefixes)
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
        if (
            not sep
            or not key
            or len(parts) < 4
            or any(p in ("", ".", "..") for p in parts)
            or parts[1] != "mailroom"
            or parts[2] != tenant.slug
        ):
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
    return (
        f"{problem}. Allowed: {allowed_forms(tenant)}; or a platform reference bound to this row in "
        f"MAILROOM_PLATFORM_SECRET_REFS ({ref}={label}), set by a platform operator."
    )


def clear_scope_cache() -> None:
    """Forget the parsed platform list and the other tenants' prefixes (settings or tenants changed)."""
    _others_cache.clear()
    _parsed.clear()
