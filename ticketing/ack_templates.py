"""Acknowledgment templates: what may be written, how it is rendered, which one answers a message.

A template is Django's template language as the REST destination's restricted engine compiles it
(`ticketing.destinations.rest_templates`: no loaders, includes or slow filters), narrowed further when it is
saved (`template_errors`): only the PLACEHOLDERS, no attribute access (`{{ subject.upper }}`), no loop or
tag but `{% if %}` and `{% comment %}`, only the ALLOWED_FILTERS, a one-line subject; and it must render
within the limits for placeholder values at their longest. At send time (`render`) it is rendered again
under the REST time limit (MAILROOM_REST_TEMPLATE_SECONDS) and an output cap
(MAILROOM_ACK_TEMPLATE_MAX_CHARS for the body, SUBJECT_MAX_CHARS for the subject): a template stored past
the save check that outgrows them gives `TemplateProblem`, and no acknowledgment (`ack_template_failed`).

Values are plain text for a plain-text email: nothing is HTML-escaped; the subject is made one line
(every run of whitespace, CR and LF included, is one space), so no header can be injected.

Which template (`ticketing.ack_selectors.template_for`): the message's language (`ticketing.ack_language`):
the mailbox's template for it, else the tenant's for it, else the mailbox's any-language one, else the
tenant's; with none, the built-in English text (`ticketing.acknowledgments`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.template.base import FilterExpression, TextNode, Variable, VariableNode
from django.template.defaulttags import CommentNode, IfNode, TemplateLiteral

from . import business_hours as hours
from .destinations.rest_templates import ENGINE, TemplateProblem, compile_template, render_text

if TYPE_CHECKING:
    from .ack_models import BusinessHours

PLACEHOLDERS = ("requester_name", "ticket_number", "subject", "mailbox", "business_hours", "answer_by")
ALLOWED_FILTERS = ("default", "upper", "lower", "title", "capfirst")
MAX_SOURCE_CHARS = 10_000
SUBJECT_MAX_CHARS = 250
# The longest each value can be when sent (what `values` cuts them to): the save check renders with these.
VALUE_MAX_CHARS = {
    "requester_name": 100,
    "ticket_number": 20,
    "subject": 200,
    "mailbox": 320,
    "business_hours": 300,
    "answer_by": 60,
}
SAMPLE_VALUES = {
    "requester_name": "Jane Doe",
    "ticket_number": "MR-1042",
    "subject": "Printer on fire",
    "mailbox": "support@acme.test",
    "business_hours": "Mon-Fri 09:00-17:00 (Europe/Berlin)",
    "answer_by": "2026-12-07 17:00 (Europe/Berlin)",
}
_FILTER_NAMES = {id(function): name for name, function in ENGINE.template_builtins[0].filters.items()}


def body_max_chars() -> int:
    return settings.MAILROOM_ACK_TEMPLATE_MAX_CHARS


def _lookup_problem(variable) -> str | None:
    if not isinstance(variable, Variable) or variable.lookups is None:
        return None  # a literal ("text", 3)
    if len(variable.lookups) > 1:
        return (
            f"{{{{ {variable.var} }}}}: attribute access is not allowed; "
            f"use the placeholders as they are ({', '.join(PLACEHOLDERS)})"
        )
    if variable.lookups[0] not in PLACEHOLDERS:
        return f"unknown placeholder {variable.lookups[0]!r} (known: {', '.join(PLACEHOLDERS)})"
    return None


def _variable_problem(expression) -> str | None:
    if not isinstance(expression, FilterExpression):
        return None
    problem = _lookup_problem(expression.var)
    for function, arguments in expression.filters:
        if problem:
            break
        name = _FILTER_NAMES.get(id(function), getattr(function, "__name__", "?"))
        if name not in ALLOWED_FILTERS:
            return f"the filter {name} is not allowed (allowed: {', '.join(ALLOWED_FILTERS)})"
        problem = next(
            (p for is_variable, argument in arguments if is_variable and (p := _lookup_problem(argument))), None
        )
    return problem


def _condition_problem(condition) -> str | None:
    if condition is None:
        return None
    if isinstance(condition, TemplateLiteral):
        return _variable_problem(condition.value)
    for side in ("first", "second"):
        problem = _condition_problem(getattr(condition, side, None))
        if problem:
            return problem
    return None


def _node_problems(nodelist) -> str | None:
    for node in nodelist:
        if isinstance(node, TextNode | CommentNode):
            continue
        if isinstance(node, VariableNode):
            problem = _variable_problem(node.filter_expression)
        elif isinstance(node, IfNode):
            problem = None
            for condition, branch in node.conditions_nodelists:
                problem = _condition_problem(condition) or _node_problems(branch)
                if problem:
                    break
        else:
            tag = getattr(node, "token", None)
            name = tag.split_contents()[0] if tag is not None else type(node).__name__
            if name == "for":
                return (
                    "loops ({% for %}) are not allowed: an acknowledgment repeats nothing, and a loop over "
                    "a text grows with it"
                )
            return f"the tag {{% {name} %}} is not allowed (only {{% if %}} and {{% comment %}})"
        if problem:
            return problem
    return None


def source_problem(source: str) -> str | None:
    """Why `source` may not be saved as a subject or body template (None: it may)."""
    if len(source) > MAX_SOURCE_CHARS:
        return f"at most {MAX_SOURCE_CHARS} characters"
    try:
        template = compile_template(source)
    except TemplateProblem as exc:
        return str(exc)
    return _node_problems(template.nodelist)


def _longest_values() -> dict:
    # U+FB03 (the ffi ligature) upper-cases to three letters, the most any character grows: with it, what
    # `upper` or `title` can make of any value at its longest is covered.
    return {name: "\ufb03" * size for name, size in VALUE_MAX_CHARS.items()}


def template_errors(*, subject: str, body: str) -> dict[str, str]:
    """Field -> why it may not be saved: the sandbox's rules, then a render within the limits for sample
    values and for every value at its longest."""
    errors = {}
    if "\r" in subject or "\n" in subject:
        errors["subject"] = "The subject is one line (no line breaks)."
    for name, source in (("subject", subject), ("body", body)):
        problem = errors.get(name) or source_problem(source)
        if problem:
            errors[name] = problem[:1].upper() + problem[1:] + ("" if problem.endswith(".") else ".")
    if errors:
        return errors
    for values, what in ((SAMPLE_VALUES, "sample values"), (_longest_values(), "every placeholder at its longest")):
        try:
            render(subject=subject, body=body, values=values)
        except TemplateProblem as exc:
            return {"body": f"{str(exc)[:1].upper()}{str(exc)[1:]} (rendered with {what})."}
    return {}


def one_line(text: str, limit: int) -> str:
    return " ".join(str(text or "").split())[:limit]


def render(*, subject: str, body: str, values: dict) -> tuple[str, str]:
    """(subject, body) rendered within the limits; raises TemplateProblem."""
    seconds = settings.MAILROOM_REST_TEMPLATE_SECONDS
    rendered_subject = render_text(compile_template(subject), values, seconds=seconds, max_chars=SUBJECT_MAX_CHARS * 4)
    rendered_body = render_text(compile_template(body), values, seconds=seconds, max_chars=body_max_chars())
    return one_line(rendered_subject, SUBJECT_MAX_CHARS), rendered_body


@dataclass(frozen=True)
class Promise:
    business_hours: str = ""  # "Mon-Fri 09:00-17:00 (Europe/Berlin)"
    answer_by: str = ""  # "2026-12-07 17:00 (Europe/Berlin)"; "" without a response time
    at: datetime | None = None


def promise(row: BusinessHours | None, *, start: datetime) -> Promise:
    """What the business hours say for a message received at `start`."""
    if row is None:
        return Promise()
    described = hours.describe(row.weekly, row.timezone)
    if row.response_hours is None:
        return Promise(business_hours=described)
    plan = hours.schedule(
        timezone_name=row.timezone,
        weekly=row.weekly,
        country=row.holidays_country,
        subdivision=row.holidays_subdivision,
    )
    at = hours.answer_by(plan, start, row.response_hours)
    return Promise(business_hours=described, answer_by=hours.local_text(at, row.timezone) if at else "", at=at)


def values(*, requester_name: str, ticket_number: str, subject: str, mailbox: str, kept: Promise) -> dict:
    """The placeholder values, each one line and cut to VALUE_MAX_CHARS."""
    raw = {
        "requester_name": requester_name,
        "ticket_number": ticket_number,
        "subject": subject,
        "mailbox": mailbox,
        "business_hours": kept.business_hours,
        "answer_by": kept.answer_by,
    }
    return {name: one_line(value, VALUE_MAX_CHARS[name]) for name, value in raw.items()}
