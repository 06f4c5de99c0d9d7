"""Who may use an address: the normal form that makes a mailbox address unique, and the tenants' verified domains.

A mailbox address is unique across the platform by its key (`address_key`): lower-cased, the domain in its
ASCII (IDNA) form, the local part without its `+tag`. `support@acme.test`, `Support@ACME.test` and
`support+billing@acme.test` share one key, so they are one mailbox, in one tenant: `Mailbox.address_key`
carries a unique constraint, and LMTP delivers a recipient by the same key (intake.channels.lmtp).

A tenant may only use addresses in its verified domains (`VerifiedDomain`, set by a superuser): the mailbox
address (which is also the `From` of its acknowledgments: ticketing.acknowledgments) and every entry of
`allowed_recipients`. `mailbox_address_errors` is what `Mailbox.clean()` runs, so the admin, the REST API and
anything else that saves through `full_clean` refuse the same things with the same messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Mailbox, Tenant, VerifiedDomain

ADDRESS_IN_USE = (
    "This address is already used by another mailbox: addresses are unique across the platform, "
    "ignoring case and any +tag ({key})."
)
NO_BASE_BEFORE_TAG = "An address needs a local part before its +tag."


def normalize_domain(domain: str) -> str:
    """`ACME.Test.` -> `acme.test`; an internationalized name in its ASCII form (`xn--...`)."""
    domain = (domain or "").strip().rstrip(".").lower()
    try:
        return domain.encode("idna").decode("ascii")
    except UnicodeError:  # not encodable (an empty or over-long label): compared as written
        return domain


def split_address(address: str) -> tuple[str, str]:
    """(local part, normalised domain); ("", "") when `address` has no `local@domain` shape."""
    local, at, domain = (address or "").strip().rpartition("@")
    if not at or not local or not domain:
        return "", ""
    return local.lower(), normalize_domain(domain)


def address_key(address: str) -> str:
    """The key that makes an address unique: `Support+Billing@ACME.test` -> `support@acme.test` ("" if none)."""
    local, domain = split_address(address)
    if not local:
        return ""
    base = local.split("+", 1)[0] or local  # "+x@d" has no base: keyed as written (and refused by clean())
    return f"{base}@{domain}"


def verified_domains(tenant: Tenant) -> list[str]:
    return sorted(tenant.verified_domains.values_list("domain", flat=True))


def verify_domain(*, tenant: Tenant, domain: str, verified_by: str) -> VerifiedDomain:
    """Give `domain` to `tenant` (a platform act: the demo set-up, a superuser's script); idempotent.

    Raises ValueError when another tenant holds the domain: it belongs to one tenant only.
    """
    # The model through the tenant's relation, all tenants' rows through its manager: this module is what the
    # models' clean() calls, so it does not import them.
    row, _ = tenant.verified_domains.model._default_manager.get_or_create(
        domain=normalize_domain(domain), defaults={"tenant": tenant, "verified_by": verified_by}
    )
    if row.tenant_id != tenant.pk:
        raise ValueError(f"{row.domain} is a verified domain of another tenant")
    return row


def _outside(domains: list[str], tenant: Tenant) -> str:
    listed = ", ".join(domains) if domains else "none yet"
    return (
        f"Tenant {tenant.slug} may only use its verified domains ({listed}); a superuser verifies a "
        f"domain on the tenant's page."
    )


def mailbox_address_errors(mailbox: Mailbox) -> dict[str, str]:
    """Field -> message for what `mailbox` may not use; {} when all is well. Needs `mailbox.tenant`.

    The domain rule judges what is new: a new mailbox, a changed address (by key) or tenant, an entry added to
    `allowed_recipients`. A value stored before the rule existed is kept, so a tenant can still pause or
    edit that mailbox (the migration named those domains for a superuser to assign). Uniqueness: always.
    """
    mailboxes = type(mailbox)._default_manager  # the model whose clean() calls this: not imported here
    errors: dict[str, str] = {}
    stored = (
        mailboxes.filter(pk=mailbox.pk).values("tenant_id", "address", "allowed_recipients").first()
        if mailbox.pk
        else None
    )
    if stored and stored["tenant_id"] != mailbox.tenant_id:
        stored = None  # moved to another tenant: judged as new there
    domains = verified_domains(mailbox.tenant)
    local, domain = split_address(mailbox.address)
    key = address_key(mailbox.address)
    if local:  # a malformed address is the EmailField's error, not ours
        if not local.split("+", 1)[0]:
            errors["address"] = NO_BASE_BEFORE_TAG
        elif domain not in domains and not (stored and address_key(stored["address"]) == key):
            errors["address"] = f"{domain} is not a verified domain of this tenant. {_outside(domains, mailbox.tenant)}"
        elif mailboxes.filter(address_key=key).exclude(pk=mailbox.pk).exists():
            errors["address"] = ADDRESS_IN_USE.format(key=key)
    recipients = mailbox.allowed_recipients
    if recipients in (None, ""):
        recipients = []
    if not isinstance(recipients, list) or not all(isinstance(entry, str) for entry in recipients):
        errors["allowed_recipients"] = 'A list of addresses or "@domain" entries.'
    else:
        kept = set()
        if stored and isinstance(stored["allowed_recipients"], list):
            kept = {str(entry).strip().lower() for entry in stored["allowed_recipients"]}
        outside = [
            entry.strip()
            for entry in recipients
            if entry.strip()
            and entry.strip().lower() not in kept
            and normalize_domain(entry.strip().rpartition("@")[2]) not in domains
        ]
        if outside:
            errors["allowed_recipients"] = (
                f"Outside this tenant's verified domains: {', '.join(outside[:10])}. "
                f"{_outside(domains, mailbox.tenant)}"
            )
    return errors
