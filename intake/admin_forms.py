"""The mailbox form of the admin: settings checked key by key against the provider's schema
(`intake.providers.settings_schema`), allowed recipients edited one per line, and the warning for a secret
reference that does not resolve now. The API applies the same schema (reconciliation.api.serializers)."""

import json

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from . import archive
from .models import Mailbox
from .providers.settings_schema import known_settings
from .secrets import resolution_problem

SECRET_FORMS = (
    "env:MAILROOM_T_<TENANT>_<NAME> (<TENANT>: the tenant slug in capitals, - as _), a file under "
    "MAILROOM_SECRETS_DIR/<tenant>/, or vault:<mount>/mailroom/<tenant>/<path>#<key>. "
    "A reference, never the secret itself."
)
DOMAIN_ENTRY = "@"


class LinesField(forms.CharField):
    """A list of text entries edited one per line (a JSON list pasted in is read as well)."""

    widget = forms.Textarea(attrs={"rows": 4, "cols": 60})

    def __init__(self, *, validate_entry=None, **kwargs):
        self.validate_entry = validate_entry
        kwargs.setdefault("required", False)
        super().__init__(strip=False, **kwargs)

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return "\n".join(str(item) for item in value)
        return value

    def to_python(self, value):
        if isinstance(value, (list, tuple)):
            return [str(item).strip() for item in value if str(item).strip()]
        text = (value or "").strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                return [str(item).strip() for item in parsed if str(item).strip()]
        return [line.strip() for line in text.replace(",", "\n").splitlines() if line.strip()]

    def validate(self, value):
        if self.required and not value:
            raise ValidationError(self.error_messages["required"], code="required")
        problems = []
        for number, entry in enumerate(value, start=1):
            try:
                if self.validate_entry:
                    self.validate_entry(entry)
            except ValidationError as exc:
                problems.append(f"line {number} ({entry[:80]}): {' '.join(exc.messages)}")
        if problems:
            raise ValidationError(problems)

    def run_validators(self, value):
        return  # each entry is judged by validate()

    def has_changed(self, initial, data):
        return self.to_python(initial or []) != self.to_python(data)


def validate_recipient(entry: str) -> None:
    """An address, or "@domain" for every address of a domain."""
    if entry.startswith(DOMAIN_ENTRY):
        try:
            validate_email(f"x{entry}")
        except ValidationError:
            raise ValidationError("not a domain (write @example.com)") from None
        return
    try:
        validate_email(entry)
    except ValidationError:
        raise ValidationError("not an email address (or @domain for a whole domain)") from None


class MailboxForm(forms.ModelForm):
    allowed_recipients = LinesField(
        validate_entry=validate_recipient,
        label="Allowed recipients",
        help_text="One per line: an address, or @domain for every address of a domain. Empty: the mailbox's "
        "own address only.",
    )

    class Meta:
        model = Mailbox
        fields = "__all__"
        help_texts = {
            "credentials_ref": f"The password or token. {SECRET_FORMS}",
            "webhook_secret_ref": f"The webhook signing secret. {SECRET_FORMS}",
            "archive_before": "Archive import (IMAP, Gmail, Graph): mail received before this moment "
            "is imported as history, never acknowledged; the next polls fetch it. "
            "Empty: live only.",
            "archive_tickets": "What the history becomes: no tickets (stored and reconciled only) or closed tickets.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields.get("settings")
        if field is not None:
            provider = (
                (self.data.get("provider") if self.is_bound else None)
                or self.initial.get("provider")
                or getattr(self.instance, "provider", "")
                or "raw"
            )
            field.help_text = (
                f"A JSON object of this provider's settings ({provider}: "
                f"{', '.join(known_settings(provider))}). Unknown names are refused."
            )

    def clean(self):
        cleaned = super().clean()
        if {"archive_before", "archive_tickets"} & set(self.changed_data):  # a new archive import (intake.archive)
            before = cleaned.get("archive_before")
            if before is None and self.instance.archive_before is not None:
                errors = {
                    "archive_before": "an archive import cannot be undone (what it imported stays history); "
                    "pause the mailbox to stop one"
                }
            else:
                errors = archive.choice_errors(
                    provider=cleaned.get("provider") or self.instance.provider,
                    before=before,
                    tickets=cleaned.get("archive_tickets") or "",
                )
            for name, message in errors.items():
                self.add_error(name if name in self.fields else None, message)
        return cleaned


def secret_warnings(row, fields) -> list[str]:
    """A sentence for each reference of `row` that does not resolve now: saved anyway (a secret may be
    provisioned after the row), but said, naming the reference, never a value."""
    tenant = getattr(row, "tenant", None)
    warnings = []
    for name in fields:
        ref = getattr(row, name, "")
        problem = resolution_problem(ref, tenant=tenant, owner=row) if ref else ""
        if problem:
            label = row._meta.get_field(name).verbose_name
            warnings.append(
                f"Saved, but the {label} {ref} does not resolve now ({problem}): until it does, "
                f"what needs it will fail."
            )
    return warnings
