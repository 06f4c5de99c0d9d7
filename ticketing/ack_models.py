"""What a tenant says in its acknowledgments, and when it answers: per mailbox, falling back to the tenant.

`AcknowledgmentTemplate`: a subject and a body (the sandboxed template language of `ticketing.ack_templates`)
per language ("" = any language, the fallback). `BusinessHours`: when the mailbox's people work (weekly
hours in a timezone, the public holidays of a country or subdivision) and how many of those hours an
answer takes (`ticketing.business_hours` counts them). Imported by `ticketing.models`.
"""

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from intake.models import Mailbox, Tenant


def _check_mailbox_tenant(row) -> dict:
    if row.mailbox_id and row.tenant_id and row.mailbox.tenant_id != row.tenant_id:
        return {"mailbox": "This mailbox belongs to another tenant."}
    return {}


class AcknowledgmentTemplate(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="ack_templates")
    mailbox = models.ForeignKey(
        Mailbox,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="ack_templates",
        help_text="empty: the tenant's template, for every mailbox without its own",
    )
    language = models.CharField(
        max_length=2,
        blank=True,
        help_text=(
            "ISO 639-1 code (de, fr, ...) of the mail this template answers; empty: any language (the fallback)"
        ),
    )
    subject = models.CharField(max_length=300, help_text="one line; the ticket's [#MR-n] is put in front of it")
    body = models.TextField(help_text="plain text with placeholders such as {{ requester_name }}")
    updated_by = models.CharField(max_length=150, blank=True, editable=False)
    updated_at = models.DateTimeField("updated", auto_now=True)

    class Meta:
        verbose_name = "acknowledgment template"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "language"],
                condition=Q(mailbox__isnull=True),
                name="ack_template_one_per_tenant_language",
                violation_error_message="The tenant has a template for this language.",
            ),
            models.UniqueConstraint(
                fields=["mailbox", "language"],
                condition=Q(mailbox__isnull=False),
                name="ack_template_one_per_mailbox_language",
                violation_error_message="The mailbox has a template for this language.",
            ),
            models.CheckConstraint(
                condition=Q(language="") | Q(language__regex=r"^[a-z]{2}$"), name="ack_template_language_code"
            ),
        ]

    def __str__(self):
        where = f"mailbox {self.mailbox}" if self.mailbox_id else "tenant default"
        return f"{self.language or 'any language'} ({where})"

    def clean(self):
        # Here, not at the top: the language detector and the template engine load only when a template is saved.
        from . import ack_language, ack_templates

        self.language = (self.language or "").strip().lower()
        errors = _check_mailbox_tenant(self)
        if self.language and not ack_language.is_known(self.language):
            errors["language"] = f"{self.language!r} is not an ISO 639-1 language code the detector knows."
        errors.update(ack_templates.template_errors(subject=self.subject or "", body=self.body or ""))
        if errors:
            raise ValidationError(errors)


class BusinessHours(models.Model):
    """When a mailbox's (or, mailbox empty, every mailbox of the tenant's) people answer."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="business_hours")
    mailbox = models.OneToOneField(
        Mailbox,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="business_hours",
        help_text="empty: the tenant's hours",
    )
    timezone = models.CharField(max_length=64, default="UTC", help_text="IANA name, e.g. Europe/Berlin")
    weekly = models.JSONField(
        "weekly hours",
        default=dict,
        blank=True,
        help_text=(
            'e.g. {"mon": [["09:00", "17:00"]], "tue": [["09:00", "12:00"], ["13:00", "17:00"]]}; '
            "a day not named is closed"
        ),
    )
    holidays_country = models.CharField(
        "holidays of country",
        max_length=3,
        blank=True,
        help_text="ISO 3166 code (DE, US, ...): its public holidays are closed",
    )
    holidays_subdivision = models.CharField(
        "subdivision", max_length=10, blank=True, help_text="e.g. BY for Bavaria (optional)"
    )
    response_hours = models.PositiveIntegerField(
        "answer within (business hours)", null=True, blank=True, help_text="empty: no 'we will answer by' line"
    )
    updated_by = models.CharField(max_length=150, blank=True, editable=False)
    updated_at = models.DateTimeField("updated", auto_now=True)

    class Meta:
        verbose_name = "business hours"
        verbose_name_plural = "business hours"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(mailbox__isnull=True),
                name="business_hours_one_per_tenant",
                violation_error_message="The tenant has its business hours already.",
            ),
        ]

    def __str__(self):
        return f"business hours of {self.mailbox or 'the tenant'}"

    def clean(self):
        from . import business_hours

        errors = _check_mailbox_tenant(self)
        errors.update(
            business_hours.settings_errors(
                timezone_name=self.timezone,
                weekly=self.weekly,
                country=self.holidays_country,
                subdivision=self.holidays_subdivision,
            )
        )
        if errors:
            raise ValidationError(errors)
