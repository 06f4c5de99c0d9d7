from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, reverse_lazy
from django.utils.functional import lazy
from django.views.generic import RedirectView

from intake import views as intake_views

# The admin's "View site": the console is the admin itself, so the link goes to the other face of the instance,
# the REST API's docs page (/api/docs/), which a console session may read in production too (SchemaAccess).
admin.site.site_url = reverse_lazy("api:docs")

FAVICON = "reconciliation/favicon.ico"  # linked from templates/admin/base_site.html as well

urlpatterns = [
    # The front door: the console. Not permanent, so browsers do not pin it.
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False), name="home"),
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)(FAVICON), permanent=False), name="favicon"),
    path("healthz", intake_views.healthz, name="healthz"),
    path("readyz", intake_views.readyz, name="readyz"),
    path("webhooks/", include("intake.urls")),
    path("metrics", include("reconciliation.metrics")),  # Prometheus text, bearer token (reconciliation.metrics)
    path("api/", include("reconciliation.api.urls")),  # REST API /api/v1/ (index, resources), schema, docs
    path("admin/", admin.site.urls),
]
