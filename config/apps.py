"""The admin app under Mailroom's own site: `MailroomAdminSite` (config.admin_site) is `admin.site`."""

from django.contrib.admin.apps import AdminConfig


class MailroomAdminConfig(AdminConfig):
    default_site = "config.admin_site.MailroomAdminSite"
