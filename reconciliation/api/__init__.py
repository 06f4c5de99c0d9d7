"""The REST API under /api/v1/ (docs/design.md §7 "REST API"): thin DRF views over the console's reads and writes.

Every read goes through `reconciliation.selectors` (tenant-scoped), every queue action through
`reconciliation.services` (the admin's calls: same permission checks, intents, keys and audit rows).

    authentication  `Authorization: Token <t>` (reconciliation.services.api_tokens; hashed at rest)
    pagination      cursor pages
    errors          every error as application/problem+json
    permissions     the console's roles, per endpoint
    serializers     what is shown, and the validation of writes (configuration: the models' full_clean)
    views, urls     the endpoints
"""
