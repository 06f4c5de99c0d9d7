"""/api/v1/ (the REST API and its index), /api/schema/ (OpenAPI 3) and /api/docs/ (Swagger UI, assets from /static/).

Included by config/urls.py under `api/`.
"""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.authentication import SessionAuthentication
from rest_framework.routers import DefaultRouter

from . import views
from .authentication import ApiTokenAuthentication
from .index import ApiIndex
from .permissions import SchemaAccess

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("events", views.EventViewSet, basename="event")
router.register("intents", views.IntentViewSet, basename="intent")
router.register("mappings", views.MappingViewSet, basename="mapping")
router.register("queue", views.QueueViewSet, basename="queue")
router.register("mailboxes", views.MailboxViewSet, basename="mailbox")
router.register("destinations", views.DestinationViewSet, basename="destination")
router.register("routing-rules", views.RoutingRuleViewSet, basename="routing-rule")
router.register("sender-lists", views.SenderListEntryViewSet, basename="sender-list-entry")
router.register("reconciliation-runs", views.RunViewSet, basename="reconciliation-run")
router.register("findings", views.FindingViewSet, basename="finding")

# The schema and its docs page are read in a browser too: a console session counts (GET only, so no CSRF).
DOCS_AUTHENTICATION = [ApiTokenAuthentication, SessionAuthentication]

app_name = "api"
urlpatterns = [
    # The index lists the registry above, so a new resource shows up there by itself (reconciliation.api.index).
    path("v1/", ApiIndex.as_view(routes=[(prefix, basename) for prefix, _, basename in router.registry]), name="index"),
    path("v1/", include(router.urls)),
    # Public in development; in production behind a token or a console session (SchemaAccess). The docs page
    # loads its script from ?script= (the split view), so it keeps to the Content-Security-Policy.
    path(
        "schema/",
        SpectacularAPIView.as_view(authentication_classes=DOCS_AUTHENTICATION, permission_classes=[SchemaAccess]),
        name="schema",
    ),
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(
            url_name="api:schema", authentication_classes=DOCS_AUTHENTICATION, permission_classes=[SchemaAccess]
        ),
        name="docs",
    ),
]
