"""`{% credentials_banner %}`: the mailboxes of the user's tenants whose credentials need an admin, on the
dashboard and the recovery queue (one include, no view of theirs changed)."""

from django import template

from intake.oauth_consent.selectors import mailboxes_needing_credentials
from intake.selectors import visible_tenants

register = template.Library()


@register.inclusion_tag("admin/intake/credentials_banner.html", takes_context=True)
def credentials_banner(context):
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"credential_problems": []}
    return {"credential_problems": mailboxes_needing_credentials(tenant_ids=visible_tenants(user).values("pk"))}
