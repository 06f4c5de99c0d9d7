"""The Mailroom console: Django's admin under its own name, its index grouped by job.

`MailroomAdminSite` is the default admin site (config.apps.MailroomAdminConfig), so every
`@admin.register` of the apps lands here unchanged. Which section of the index a model belongs to is
decided by `SECTION_OF`, one table by (app_label, model name); a model missing from it falls in "Other"
(tests/test_console_site.py fails until it is placed). The "Platform internals" section is more than
hidden: its models' admins refuse every non-superuser (`SuperusersOnlyAdminMixin`, mixed in when they are
registered), so their URLs answer 403 whatever permissions a user holds.
"""

from django.contrib.admin import AdminSite, ModelAdmin
from django.db.models.base import ModelBase
from django.urls import NoReverseMatch, reverse

RECOVERY, CONFIGURATION, EVIDENCE, INTERNALS, OTHER = "recovery", "configuration", "evidence", "internals", "other"

# The index's sections, in order: (key, title, what an operator finds there).
SECTIONS = (
    (RECOVERY, "Recovery queue", "Messages waiting for a person, the dashboard, and the pauses."),
    (CONFIGURATION, "Configuration", "Tenants, mailboxes, where tickets go and how they are routed, access."),
    (EVIDENCE, "Evidence", "What happened to each message: events, audit trail, intents, tickets, reconciliation."),
    (
        INTERNALS,
        "Platform internals",
        "Bookkeeping of the workers, the scheduler and login throttling. Superusers only.",
    ),
    (OTHER, "Other", "Not yet placed in a section."),
)

# (app_label, model_name) -> section; the order here is the order on the index.
SECTION_OF = {
    ("reconciliation", "recoveryitem"): RECOVERY,
    ("reconciliation", "pauseswitch"): RECOVERY,
    ("reconciliation", "bulkjob"): RECOVERY,  # bulk work over a filter (reconciliation.admin.bulk_jobs)
    ("intake", "tenant"): CONFIGURATION,
    ("intake", "verifieddomain"): CONFIGURATION,
    ("intake", "mailbox"): CONFIGURATION,
    ("ticketing", "destination"): CONFIGURATION,
    ("ticketing", "routingpolicy"): CONFIGURATION,
    ("ticketing", "routingrule"): CONFIGURATION,
    ("intake", "senderlistentry"): CONFIGURATION,
    ("ticketing", "acknowledgmenttemplate"): CONFIGURATION,
    ("ticketing", "businesshours"): CONFIGURATION,
    ("reconciliation", "apitoken"): CONFIGURATION,
    ("auth", "user"): CONFIGURATION,
    ("auth", "group"): CONFIGURATION,
    ("intake", "inboxevent"): EVIDENCE,
    ("intake", "auditevent"): EVIDENCE,
    ("ticketing", "intent"): EVIDENCE,
    ("ticketing", "ticketmapping"): EVIDENCE,
    ("ticketing", "ticket"): EVIDENCE,
    ("ticketing", "ticketcomment"): EVIDENCE,
    ("ticketing", "copiedmessage"): EVIDENCE,
    ("ticketing", "notification"): EVIDENCE,
    ("reconciliation", "reconciliationrun"): EVIDENCE,
    ("reconciliation", "finding"): EVIDENCE,
    ("intake", "secretresolution"): EVIDENCE,
    ("intake", "mailboxaudit"): EVIDENCE,
    ("intake", "outboxmessage"): INTERNALS,
    ("intake", "pollcursor"): INTERNALS,
    ("intake", "webhooknonce"): INTERNALS,
    ("intake", "webhookrejectioncount"): INTERNALS,
    ("intake", "providersubscription"): INTERNALS,
    ("ticketing", "threadlease"): INTERNALS,
    ("ticketing", "destinationattempt"): INTERNALS,
    ("ticketing", "undeliverableaddress"): INTERNALS,
    ("axes", "accessattempt"): INTERNALS,
    ("axes", "accessfailurelog"): INTERNALS,
    ("axes", "accesslog"): INTERNALS,
    ("django_celery_beat", "periodictask"): INTERNALS,
    ("django_celery_beat", "intervalschedule"): INTERNALS,
    ("django_celery_beat", "crontabschedule"): INTERNALS,
    ("django_celery_beat", "solarschedule"): INTERNALS,
    ("django_celery_beat", "clockedschedule"): INTERNALS,
}
ORDER = {key: position for position, key in enumerate(SECTION_OF)}

# Names on the index where a model's own plural says too little out of its app's context (or is mis-cased:
# reconciliation.ApiToken reads "Api tokens" until its verbose_name is set).
NAMES = {
    ("reconciliation", "apitoken"): "API tokens",
    ("axes", "accessattempt"): "Login attempts (throttling)",
    ("axes", "accessfailurelog"): "Login failures",
    ("axes", "accesslog"): "Login log",
    ("django_celery_beat", "periodictask"): "Scheduled tasks",
    ("django_celery_beat", "intervalschedule"): "Schedules: intervals",
    ("django_celery_beat", "crontabschedule"): "Schedules: crontabs",
    ("django_celery_beat", "solarschedule"): "Schedules: solar events",
    ("django_celery_beat", "clockedschedule"): "Schedules: clocked",
}


def section_of(model) -> str:
    return SECTION_OF.get((model._meta.app_label, model._meta.model_name), OTHER)


class SuperusersOnlyAdminMixin:
    """A platform-internal model's admin: nobody but a superuser may list, open, add, change or delete.

    Every admin view checks these, so a non-superuser gets a 403 on the URLs (and the index, the app
    pages and the autocomplete leave the model out), whatever permissions a group grants."""

    def has_module_permission(self, request):
        return request.user.is_superuser and super().has_module_permission(request)

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args, **kwargs):
        return request.user.is_superuser and super().has_add_permission(request, *args, **kwargs)

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_delete_permission(request, obj)


class MailroomAdminSite(AdminSite):
    site_header = "Mailroom"
    site_title = "Mailroom"
    index_title = "Console"
    site_url = "/"  # the landing page (config/urls.py): the product, the console, the API docs, health
    # The grouped index replaces the sidebar, and without it the recovery queue fits 1400 px.
    enable_nav_sidebar = False

    def register(self, model_or_iterable, admin_class=None, **options):
        models = [model_or_iterable] if isinstance(model_or_iterable, ModelBase) else model_or_iterable
        for model in models:
            klass = admin_class or ModelAdmin
            if section_of(model) == INTERNALS and not issubclass(klass, SuperusersOnlyAdminMixin):
                klass = type(klass.__name__, (SuperusersOnlyAdminMixin, klass), {"__module__": klass.__module__})
            super().register(model, klass, **options)

    def get_app_list(self, request, app_label=None):
        """The index's sections (an app's own page, `app_label` given, keeps Django's list of that app).

        Each section has the keys of one of Django's app entries (name, app_label, models, ...), so the
        admin's templates can show it; `description` says what it holds."""
        if app_label is not None:
            return super().get_app_list(request, app_label)
        entries = [entry for app in self._build_app_dict(request).values() for entry in app["models"]]
        by_section = {key: [] for key, _, _ in SECTIONS}
        for entry in sorted(entries, key=lambda e: (ORDER.get(self.key_of(e), len(ORDER)), e["name"])):
            entry["name"] = NAMES.get(self.key_of(entry), entry["name"])
            by_section[section_of(entry["model"])].append(entry)
        if dashboard := self.dashboard_entry(by_section[RECOVERY]):
            by_section[RECOVERY].insert(1, dashboard)
        return [
            {
                "name": title,
                "app_label": key,
                "app_url": None,
                "has_module_perms": True,
                "description": about,
                "models": by_section[key],
            }
            for key, title, about in SECTIONS
            if by_section[key]
        ]

    @staticmethod
    def key_of(entry) -> tuple:
        return entry["model"]._meta.app_label, entry["model"]._meta.model_name

    def dashboard_entry(self, recovery: list) -> dict | None:
        """The operators' dashboard, for whoever sees the queue (it is one of the queue's pages)."""
        if not any(self.key_of(e) == ("reconciliation", "recoveryitem") for e in recovery):
            return None
        try:
            url = reverse("admin:reconciliation_dashboard", current_app=self.name)
        except NoReverseMatch:
            return None
        return {
            "model": None,
            "name": "Dashboard",
            "object_name": "Dashboard",
            "perms": {"view": True},
            "admin_url": url,
            "add_url": None,
            "view_only": True,
        }
