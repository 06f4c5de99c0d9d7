from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.utils.functional import lazy
from django.views.generic import RedirectView, TemplateView

from intake import views as intake_views

FAVICON = "reconciliation/favicon.ico"  # linked from templates/admin/base_site.html as well

urlpatterns = [
    # The front door (templates/mailroom/landing.html): what this is, the console, the API docs, health. It is
    # also the console's "View site". It names nothing of any tenant.
    path("", TemplateView.as_view(template_name="mailroom/landing.html"), name="home"),
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)(FAVICON), permanent=False), name="favicon"),
    path("healthz", intake_views.healthz, name="healthz"),
    path("readyz", intake_views.readyz, name="readyz"),
    path("webhooks/", include("intake.urls")),
    path("metrics", include("reconciliation.metrics")),  # Prometheus text, bearer token (reconciliation.metrics)
    path("api/", include("reconciliation.api.urls")),  # REST API /api/v1/ (index, resources), schema, docs
    path("admin/", admin.site.urls),
]
