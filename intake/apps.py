from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class IntakeConfig(AppConfig):
    name = "intake"
    verbose_name = "Intake"

    def ready(self):
        from . import schedules
        from .models import Mailbox

        # Beat follows the mailbox: its periodic poll is created, updated and disabled with it.
        post_save.connect(schedules.on_mailbox_saved, sender=Mailbox, dispatch_uid="intake.mailbox_schedule")
        post_delete.connect(schedules.on_mailbox_deleted, sender=Mailbox,
                            dispatch_uid="intake.mailbox_schedule_delete")
