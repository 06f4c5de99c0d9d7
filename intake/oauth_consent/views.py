"""The consent pages (on MailboxAdmin's URLs, intake.oauth_consent.admin): thin; every check is the service's.

`<mailbox>/connect/` says what will happen and links to the provider's sign-in page; the link, not a form: the
console's CSP (`form-action 'self'`) would stop a form's redirect to another origin, and the state it carries
is worth nothing without this session. `oauth/callback/` is the one redirect URI to register with the provider
(the mailbox comes from the state, never from the URL)."""

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from . import services
from .endpoints import endpoints_for


def _context(model_admin, request, **extra) -> dict:
    return {**model_admin.admin_site.each_context(request), "opts": model_admin.opts, **extra}


def error_page(model_admin, request, refused: services.ConsentRefused, mailbox=None):
    context = _context(
        model_admin, request, title="The mailbox was not connected", message=str(refused), mailbox=mailbox
    )
    return TemplateResponse(request, "admin/intake/mailbox/consent_error.html", context, status=refused.status)


def callback_uri(request) -> str:
    return request.build_absolute_uri(reverse("admin:intake_mailbox_oauth_callback"))


def connect_view(model_admin, request, object_id):
    try:
        mailbox = services.connectable_mailbox(user=request.user, mailbox_id=object_id)
    except services.ConsentRefused as refused:
        return error_page(model_admin, request, refused)
    problem = services.consent_problem(mailbox=mailbox)
    authorize = ""
    if not problem:
        try:
            authorize = services.start_consent(
                user=request.user, mailbox_id=mailbox.pk, session=request.session, redirect_uri=callback_uri(request)
            )
        except services.ConsentRefused as refused:
            problem = str(refused)
    ends = endpoints_for(mailbox)
    context = _context(
        model_admin,
        request,
        title=f"Connect {mailbox.slug} to {ends.name}",
        mailbox=mailbox,
        ends=ends,
        problem=problem,
        authorize_url=authorize,
        redirect_uri=callback_uri(request),
        mailbox_url=reverse("admin:intake_mailbox_change", args=[mailbox.pk]),
    )
    return TemplateResponse(request, "admin/intake/mailbox/consent_connect.html", context)


def callback_view(model_admin, request):
    query = request.GET
    try:
        mailbox = services.complete_consent(
            user=request.user,
            session=request.session,
            state=query.get("state", ""),
            code=query.get("code", ""),
            error=query.get("error", ""),
            error_description=query.get("error_description", ""),
        )
    except services.ConsentRefused as refused:
        return error_page(model_admin, request, refused)
    messages.success(
        request, f"Mailbox {mailbox.slug} is connected: the tokens were written to its credentials reference."
    )
    return HttpResponseRedirect(reverse("admin:intake_mailbox_change", args=[mailbox.pk]))
