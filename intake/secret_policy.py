"""Who may change a row's secret references, and what around them (docs/design.md §7 "Secrets").

One rule, called before a mailbox or destination is saved by the admin (intake.admin, ticketing.destination_admin),
the REST API (reconciliation.api.serializers) and commands; `resolve_secret` (intake.secrets) still refuses a
platform reference for any row it is not bound to, whatever was saved.

A platform reference (listed in MAILROOM_PLATFORM_SECRET_REFS) is the platform's secret lent to a row. Someone who
is not a superuser:
  - cannot SET one: a reference field whose new value is a platform reference the field did not hold before;
  - cannot change where a row that holds one sends it: a mailbox's provider, settings, slug or tenant; a
    destination's kind, base_url, settings, slug or tenant (replacing the platform reference by one of the
    tenant's own first is allowed, in the same change too);
  - moving a destination's base_url to another origin (scheme, user info, host or port) must enter the credentials
    reference again in that change (the API: `credentials_ref` in the same request; the admin: "Confirm
    credentials reference"), so that credentials go to a new host only on purpose.
A superuser, and `PLATFORM` (a management command the platform operator runs), may do all.
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from .secrets import allowed_forms, is_platform_ref

audit_log = logging.getLogger("mailroom.audit")

PLATFORM = object()  # the actor of a management command: the platform operator at the shell


class SecretChangeRefused(ValidationError):
    """The change is not this actor's to make; `message_dict` names the fields (as `full_clean` does)."""


@dataclass(frozen=True)
class SecretHolder:
    """A model whose rows hold secret references: which fields are references, which decide where they go."""

    ref_fields: tuple[str, ...]
    guarded_fields: tuple[str, ...]
    origin_field: str = ""  # a URL: its origin receives `origin_credentials`
    origin_credentials: str = ""
    settings_refs: tuple[str, ...] = ()  # keys of the row's `settings` that are references too

    def refs(self, values: dict) -> dict[str, str]:
        """Each reference the row's `values` hold: the fields, and "settings.<key>" for a settings reference."""
        refs = {name: values.get(name) or "" for name in self.ref_fields}
        settings = values.get("settings") if isinstance(values.get("settings"), dict) else {}
        refs.update({f"settings.{key}": str(settings.get(key) or "") for key in self.settings_refs})
        return refs


# By label, not by import: intake does not import ticketing (tools/check_layering.py).
HOLDERS = {
    # settings.client_secret_ref: the OAuth app's secret, sent to the token URL the settings name.
    "intake.mailbox": SecretHolder(
        ref_fields=("webhook_secret_ref", "credentials_ref"),
        guarded_fields=("provider", "settings", "slug", "tenant"),
        settings_refs=("client_secret_ref",),
    ),
    "ticketing.destination": SecretHolder(
        ref_fields=("credentials_ref",),
        guarded_fields=("kind", "base_url", "settings", "slug", "tenant"),
        origin_field="base_url",
        origin_credentials="credentials_ref",
    ),
}


def holder_for(row) -> SecretHolder:
    return HOLDERS[row._meta.label_lower]


def stored_values(row) -> dict | None:
    """The row's reference and guarded fields as the database holds them (FKs as ids); None for a new row."""
    if row.pk is None:
        return None
    holder = holder_for(row)
    return type(row)._default_manager.filter(pk=row.pk).values(*holder.ref_fields, *holder.guarded_fields).first()


def may_do_all(actor) -> bool:
    return actor is PLATFORM or bool(getattr(actor, "is_superuser", False))


def origin(url: str) -> tuple:
    """What decides which server a URL reaches, as both the standard library and urllib3 (what `requests`
    connects with) read it: a URL the two read differently (`https://a\\@b/`) differs from both readings."""
    from urllib3.util import parse_url

    url = (url or "").strip()
    try:
        parts, theirs = urlsplit(url), parse_url(url)
        return (
            parts.scheme.lower(),
            parts.netloc.lower(),
            (theirs.scheme or "").lower(),
            theirs.auth,
            (theirs.host or "").lower(),
            theirs.port,
        )
    except ValueError:
        return ("unparsable", url)


def _host(url: str) -> str:
    try:
        return urlsplit(url or "").netloc or "(none)"
    except ValueError:
        return "(unparsable)"


def _plain(value):
    return value.pk if hasattr(value, "_meta") else value


def check_secret_change(*, actor, row, before: dict | None, changes: dict, reentered: Iterable[str] = ()) -> None:
    """Raise SecretChangeRefused if `actor` (a user, or PLATFORM) may not write `changes` to `row`.

    `before`: the stored values (`stored_values(row)`; None for a new row). `changes`: field -> new value, the
    fields this request writes (unchanged ones may be included). `reentered`: the reference fields the actor typed
    in this request (the API: those present in the body; the admin: confirmed).
    """
    if may_do_all(actor):
        return
    holder = holder_for(row)
    before = {name: _plain(value) for name, value in (before or {}).items()}
    after = {**before, **{name: _plain(value) for name, value in changes.items()}}
    tenant = (
        changes.get("tenant")
        if hasattr(changes.get("tenant"), "_meta")
        else (row.tenant if getattr(row, "tenant_id", None) else None)
    )
    errors: dict[str, list[str]] = {}

    refs_before, refs_after = holder.refs(before), holder.refs(after)
    for name, ref in refs_after.items():
        if ref != refs_before[name] and is_platform_ref(ref):
            field, _, key = name.partition(".")
            errors.setdefault(field, []).append(
                f"{key + ': ' if key else ''}only a platform operator (superuser) may use a platform secret "
                f"reference (MAILROOM_PLATFORM_SECRET_REFS). Use one of the tenant's own: {allowed_forms(tenant)}."
            )

    held = [name for name, ref in refs_after.items() if is_platform_ref(ref) and refs_before[name]]
    if held and before:
        for name in holder.guarded_fields:
            if name in changes and after.get(name) != before.get(name):
                errors.setdefault(name, []).append(
                    f"only a platform operator (superuser) may change {name} of a {row._meta.verbose_name} that "
                    f"uses a platform secret reference ({', '.join(held)}). Replace that reference with one of "
                    "the tenant's own first."
                )

    if holder.origin_field and before:
        old_url, new_url = before.get(holder.origin_field) or "", after.get(holder.origin_field) or ""
        credentials = holder.origin_credentials
        entered = credentials in set(reentered) or (after.get(credentials) or "") != (before.get(credentials) or "")
        if after.get(credentials) and origin(new_url) != origin(old_url) and not entered:
            errors.setdefault(credentials, []).append(
                f"{holder.origin_field} moves to another host ({_host(old_url)} -> {_host(new_url)}): enter "
                f"{credentials} again in the same change (API: send {credentials} in the same request; admin: "
                "type it in 'Confirm credentials reference'), so that the credentials go there on purpose."
            )

    if errors:
        audit_log.warning(
            "refused a secret-related change of %s %s by %s: %s",
            row._meta.label_lower,
            row.pk or "(new)",
            getattr(actor, "get_username", lambda: "-")(),
            ", ".join(sorted(errors)),
        )
        raise SecretChangeRefused(errors)
