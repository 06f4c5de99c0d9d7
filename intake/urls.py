from django.urls import path

from . import views
from .channels import webhooks

urlpatterns = [
    path("raw/<slug:mailbox_slug>/", views.raw_webhook, name="raw-webhook"),
    path("<str:provider>/<slug:mailbox_slug>/", webhooks.provider_webhook, name="provider-webhook"),
    # Mailgun posts the raw MIME (`body-mime`) only to a forward URL that ends in "mime".
    path("<str:provider>/<slug:mailbox_slug>/mime", webhooks.provider_webhook, name="provider-webhook-mime"),
]
