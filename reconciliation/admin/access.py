"""Who may open the queue's pages: anyone with the queue's view permission, and nobody adds, edits or deletes
through them (every write is a service action of its own)."""

from .. import services


class QueueViewOnlyMixin:
    """For the ModelAdmins of the recovery work (the queue, the bulk jobs)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(services.PERM_VIEW_QUEUE)

    def has_module_permission(self, request):
        return self.has_view_permission(request)
