"""/api/v1/ (the REST API), /api/schema/ (OpenAPI 3) and /api/docs/ (Swagger UI, assets from /static/).

Included by config/urls.py under `api/`.
"""
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny
from rest_framework.routers import DefaultRouter

from . import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("events", views.EventViewSet, basename="event")
router.register("intents", views.IntentViewSet, basename="intent")
router.register("mappings", views.MappingViewSet, basename="mapping")
router.register("queue", views.QueueViewSet, basename="queue")
router.register("mailboxes", views.MailboxViewSet, basename="mailbox")
router.register("destinations", views.DestinationViewSet, basename="destination")
router.register("routing-rules", views.RoutingRuleViewSet, basename="routing-rule")
router.register("reconciliation-runs", views.RunViewSet, basename="reconciliation-run")
router.register("findings", views.FindingViewSet, basename="finding")

app_name = "api"
urlpatterns = [
    path("v1/", include(router.urls)),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema", permission_classes=[AllowAny]), name="docs"),
]
