from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class IntakeConfig(AppConfig):
    name = "intake"
    verbose_name = "Intake"

    def ready(self):
        from . import checks, selectors  # noqa: F401  (checks: registers the system checks)
        from .channels import schedules
        from .models import Mailbox

        # This process forgets a mailbox it cached as soon as it changes (others within seconds).
        for signal in (post_save, post_delete):
            signal.connect(
                lambda **_: selectors.forget_cached_mailboxes(),
                sender=Mailbox,
                weak=False,
                dispatch_uid=f"intake.mailbox_cache_{signal is post_save}",
            )

        # Beat follows the mailbox: its periodic poll is created, updated and disabled with it.
        post_save.connect(schedules.on_mailbox_saved, sender=Mailbox, dispatch_uid="intake.mailbox_schedule")
        post_delete.connect(schedules.on_mailbox_deleted, sender=Mailbox, dispatch_uid="intake.mailbox_schedule_delete")
