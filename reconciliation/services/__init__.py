"""Operational writes that span the apps below: demo set-up and the recovery queue's actions.

They call those apps' services. The queue's actions (`do_*`) take the acting
user: each checks the user's permission (PermissionDenied: a 403) and tenant
(InboxEvent.DoesNotExist: a 404), refuses what no longer applies
(ActionRefused, nothing written) and leaves an AuditEvent naming the user
("user:<username>"). Roles are groups: see ROLE_PERMISSIONS.

One concern per module; this package re-exports what the admin, the management
commands, the migrations and the tests use:

    setup           demo tenant, mailbox, destination and admin (`bootstrap_demo`)
    roles           the permissions each action needs; the role groups that grant them
    access          the acting user: `require`, `visible_event`, `ActionRefused`, `actor_name`
    queue_actions   one item: assign, escalate, replay, correct, requester, new action, confirm, settle, close,
                    release
    bodies          message body and attachments (security; audited)
    bulk_replay     look up, then link, replay, resolve, reroute or skip many items
    bulk_jobs       one action over every item a filter matches, as a resumable background job
    pauses          the global (superusers only), tenant, mailbox and destination pauses
    proposals       the AI proposer's suggestion on a low-confidence item: show it, accept it
    api_tokens      REST API tokens (hashed at rest, may expire): issue, revoke, authenticate
"""

from .access import ActionRefused, actor_name, visible_event  # noqa: F401
from .api_tokens import (  # noqa: F401
    EXPIRY_CHOICES,
    do_issue_api_token,
    do_revoke_api_token,
    is_expired,
    may_revoke,
    user_for_token,
    visible_tokens,
)
from .bodies import (  # noqa: F401
    BodyView,
    attachment_content_disposition,
    do_download_attachment,
    do_view_message_body,
)
from .bulk_jobs import (  # noqa: F401
    do_cancel_bulk_job,
    do_start_bulk_job,
    preview_bulk,
    run_bulk_job_chunk,
    visible_jobs,
)
from .bulk_replay import (  # noqa: F401
    DEFAULT_BULK_REPLAY_CAP,
    BulkItem,
    bulk_replay_cap,
    do_bulk_replay,
    do_bulk_replay_preview,
)
from .pauses import (  # noqa: F401
    GLOBAL_PAUSE_REFUSED,
    REASON_NEEDED,
    PauseRecord,
    do_set_destination_pause,
    do_set_global_pause,
    do_set_mailbox_pause,
    do_set_tenant_pause,
    may_set_global_pause,
    pause_records,
    tenant_pauses,
)
from .proposals import do_accept_proposal, stored_proposal  # noqa: F401
from .queue_actions import (  # noqa: F401
    ASSIGNEE_REFUSED,
    ASSIGNEE_RULE,
    CLOSE_QUARANTINED_DENIED,
    assignable_user,
    assignable_users,
    do_assign,
    do_assign_to_me,
    do_close_not_a_request,
    do_confirm_existing_ticket,
    do_correct_and_replay,
    do_enter_requester,
    do_release_quarantine,
    do_replay,
    do_replay_as_new_action,
    do_set_escalation,
    do_settle_acknowledgment,
    may_close,
    requester_address,
)
from .roles import (  # noqa: F401
    PERM_ASSIGN,
    PERM_CLOSE,
    PERM_CONFIRM,
    PERM_PAUSE,
    PERM_RELEASE,
    PERM_REPLAY,
    PERM_REPLAY_NEW,
    PERM_VIEW_BODY,
    PERM_VIEW_QUEUE,
    ROLE_PERMISSIONS,
    ensure_role_groups,
)
from .setup import DEMO_PASSWORD_VAR, DEMO_SECRET_VAR, do_bootstrap_demo, ensure_env_secret  # noqa: F401
