"""Bulk work over the queue's filter, run as a background job (placeholder: filled in by the bulk-job work)."""


def bulk_urls(model_admin) -> list:
    """The bulk pages' URL patterns, included by RecoveryItemAdmin.get_urls."""
    return []
