"""System checks (`manage.py check`): secret references outside their tenant's scope (intake.secrets).

Rows saved before references were scoped are kept as they are; they are listed here until fixed, and
`resolve_secret` refuses them meanwhile.
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
    return [checks.Warning(f"{kind} {row} (tenant {row.tenant.slug}): {field} {ref!r} is refused: {problem}",
                           hint="Move the secret into the tenant's scope (env:MAILROOM_T_<SLUG>_*, "
                                "MAILROOM_SECRETS_DIR/<slug>/, vault:<mount>/mailroom/<slug>/...) or list the "
                                "reference in MAILROOM_PLATFORM_SECRET_REFS.",
                           obj=row, id=check_id)
            for row, field, ref, problem in found]


@checks.register(checks.Tags.security)
def mailbox_secret_refs(app_configs=None, **kwargs):
    from .models import Mailbox

    warnings = secret_ref_warnings(Mailbox.objects.all(), ("webhook_secret_ref", "credentials_ref"), "mailbox",
                                   "intake.W001")
    ai_ref = settings.MAILROOM_AI_API_KEY_REF
    if ai_ref and ai_ref not in settings.MAILROOM_PLATFORM_SECRET_REFS:
        warnings.append(checks.Warning("MAILROOM_AI_API_KEY_REF is not listed in MAILROOM_PLATFORM_SECRET_REFS: "
                                       "the AI proposer cannot read its key", id="intake.W002"))
    return warnings
