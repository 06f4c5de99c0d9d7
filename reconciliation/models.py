"""What the operators' console shows: proxies of the records below, no tables of their own.

`RecoveryItem` is an `InboxEvent` seen through the recovery queue; its
permissions are the operator's capabilities. `PauseSwitch` is the global
`Switch` seen through the pause page; mailbox and destination pauses are
edited there too. Bodies and quarantine release stay on `intake.InboxEvent`
(`intake.view_message_body`, `intake.release_quarantine`).
"""
from intake.models import InboxEvent, Switch


class RecoveryItem(InboxEvent):
    class Meta:
        proxy = True
        verbose_name = "recovery item"
        verbose_name_plural = "recovery queue"
        # Nobody adds, edits or deletes an event through the queue: every change is an action.
        default_permissions = ("view",)
        permissions = [
            ("assign_recoveryitem", "Can assign recovery items and set their escalation time"),
            ("replay_recoveryitem", "Can correct the routing of recovery items and replay them"),
            ("confirm_recoveryitem", "Can confirm an existing ticket for a recovery item"),
            ("close_recoveryitem", "Can close a recovery item as not-a-request"),
            ("replay_new_action", "Can approve a replay as a new action (new action version and key)"),
        ]


class PauseSwitch(Switch):
    class Meta:
        proxy = True
        verbose_name = "pause"
        verbose_name_plural = "pauses"
        default_permissions = ("view", "change")
        permissions = [
            ("set_global_pause", "Can turn the global pause on and off (every tenant)"),
        ]
