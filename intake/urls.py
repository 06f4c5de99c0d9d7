from django.urls import path

from . import views

urlpatterns = [
    path("raw/<slug:mailbox_slug>/", views.raw_webhook, name="raw-webhook"),
]
