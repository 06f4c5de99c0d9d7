from django.contrib import admin
from django.urls import include, path

from intake import views as intake_views

urlpatterns = [
    path("healthz", intake_views.healthz, name="healthz"),
    path("readyz", intake_views.readyz, name="readyz"),
    path("webhooks/", include("intake.urls")),
    path("metrics", include("reconciliation.metrics")),  # Prometheus text, bearer token (reconciliation.metrics)
    path("api/", include("reconciliation.api.urls")),  # REST API /api/v1/, schema, docs (reconciliation.api)
    path("admin/", admin.site.urls),
]
