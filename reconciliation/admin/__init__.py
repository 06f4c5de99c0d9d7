"""The operators' console in the Django admin: the recovery queue, each item's page, and the pauses.

Every write goes through `reconciliation.services` (permission, tenant, audit);
these modules only render, validate forms and map refusals to messages, 403s
and 404s. A user sees only the tenants they are a member of, everywhere.

    filters   the queue's list filters
    forms     the forms of an item's actions
    queue     RecoveryItemAdmin: the queue and its bulk actions (item, body, bulk: its pages)
    bulk_jobs BulkJobAdmin: the list of bulk jobs over a filter
    pauses    PauseSwitchAdmin: the pause page

Django imports this package (`reconciliation.admin`); importing `queue` and
`pauses` here registers their admins.
"""

from .api_tokens import ApiTokenAdmin  # noqa: F401  (REST API tokens: list, revoke)
from .bulk_jobs import BulkJobAdmin  # noqa: F401  (the bulk jobs started from the queue)
from .pauses import PauseSwitchAdmin  # noqa: F401  (registers the pause page)
from .queue import RecoveryItemAdmin  # noqa: F401  (registers the recovery queue)
from .reconciliations import FindingAdmin, ReconciliationRunAdmin  # noqa: F401  (reconcilers' runs and findings)
