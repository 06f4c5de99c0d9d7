"""System checks (`manage.py check`): secret references a row may not use (intake.secrets), and the platform
list `MAILROOM_PLATFORM_SECRET_REFS` itself.

Rows saved before references were scoped (or bound) are kept as they are; they are listed here until fixed,
and `resolve_secret` refuses them meanwhile.
"""

from django.conf import settings
from django.core import checks
from django.db import DatabaseError


def secret_ref_warnings(queryset, fields, kind: str, check_id: str) -> list:
    from .secrets import out_of_scope

    try:
        found = list(out_of_scope(queryset.select_related("tenant").order_by("pk"), fields))
    except DatabaseError:  # no database yet, or not migrated: nothing to say
        return []
    return [
        checks.Warning(
            f"{kind} {row} (tenant {row.tenant.slug}): {field} {ref!r} is refused: {problem}",
            hint="Move the secret into the tenant's scope (env:MAILROOM_T_<SLUG>_*, "
            "MAILROOM_SECRETS_DIR/<slug>/, vault:<mount>/mailroom/<slug>/...) or bind the "
            "reference to this row in MAILROOM_PLATFORM_SECRET_REFS (<ref>=mailbox:<slug>, "
            "<ref>=destination:<tenant>/<slug> or <ref>=tenant:<slug>).",
            obj=row,
            id=check_id,
        )
        for row, field, ref, problem in found
    ]


def platform_ref_warnings() -> list:
    """The list's own problems: entries that bind nothing, `*` in production, the AI key unlisted or bound."""
    from .secrets import ANY_ROW, platform_bindings

    parsed = platform_bindings()
    warnings = [
        checks.Warning(
            f"MAILROOM_PLATFORM_SECRET_REFS entry {entry!r} does not parse: it binds nothing and resolves for nobody",
            hint="Write <ref> (unbound) or <ref>=<owner>[|<owner>...], an owner being "
            "mailbox:<slug>, destination:<tenant>/<slug>, tenant:<slug> or *; a reference "
            "that contains '=' ends its entry with '=' or '=<owners>'.",
            id="intake.W004",
        )
        for entry in parsed.malformed
    ]
    if settings.MAILROOM_ENV == "production":
        warnings += [
            checks.Warning(
                f"MAILROOM_PLATFORM_SECRET_REFS lets {ref!r} serve every row (unbound or '*') in production",
                hint="Bind the reference to the rows it serves: <ref>=mailbox:<slug>, "
                "<ref>=destination:<tenant>/<slug> or <ref>=tenant:<slug>.",
                id="intake.W003",
            )
            for ref, owners in sorted(parsed.bindings.items())
            if ANY_ROW in owners and ref != settings.MAILROOM_AI_API_KEY_REF
        ]
    ai_ref = settings.MAILROOM_AI_API_KEY_REF
    if ai_ref and ai_ref not in parsed.bindings:
        warnings.append(
            checks.Warning(
                "MAILROOM_AI_API_KEY_REF is not listed in MAILROOM_PLATFORM_SECRET_REFS: "
                "the AI proposer cannot read its key",
                id="intake.W002",
            )
        )
    elif ai_ref and ai_ref not in parsed.unbound:
        warnings.append(
            checks.Warning(
                "MAILROOM_PLATFORM_SECRET_REFS binds MAILROOM_AI_API_KEY_REF to rows: "
                "ignored, the AI key resolves only for the platform",
                hint="List the AI key's reference without '=<owners>'.",
                id="intake.W005",
            )
        )
    return warnings


def rotating_token_env_warnings() -> list:
    """OAuth mailboxes (Graph, Gmail, IMAP with auth xoauth2) whose credentials are an `env:` reference: a
    refresh token the provider rotates cannot be written back there (intake.secret_store)."""
    from django.db.models import Q

    from .models import Mailbox

    oauth = Q(provider__in=("graph", "gmail")) | Q(provider="imap", settings__auth="xoauth2")
    try:
        rows = list(
            Mailbox.objects.filter(oauth, credentials_ref__startswith="env:").select_related("tenant").order_by("pk")
        )
    except DatabaseError:
        return []
    return [
        checks.Warning(
            f"mailbox {row} (tenant {row.tenant.slug}): credentials_ref is an env: reference; "
            "env references are unsuitable for rotating refresh tokens",
            hint="A rotated refresh token cannot be written back to an environment variable and is "
            "lost at the next restart: use file:MAILROOM_SECRETS_DIR/<slug>/... or "
            "vault:<mount>/mailroom/<slug>/...#<key>.",
            obj=row,
            id="intake.W006",
        )
        for row in rows
    ]


@checks.register(checks.Tags.security)
def mailbox_secret_refs(app_configs=None, **kwargs):
    from .models import Mailbox

    return [
        *platform_ref_warnings(),
        *secret_ref_warnings(
            Mailbox.objects.all(), ("webhook_secret_ref", "credentials_ref"), "mailbox", "intake.W001"
        ),
        *rotating_token_env_warnings(),
    ]
