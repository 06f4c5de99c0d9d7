"""The templates a generic REST destination's admin writes: URL templates with {placeholders} and JSON
bodies in Django's template language, rendered by a restricted engine, and dotted paths into answers.

Templates come from admins, so the engine has no loaders, no {% load %}, no {% include %}, no
{% debug %}, {% url %}, {% csrf_token %} or {% now %}, no `random` filter (a retry must send the
very same body), and none of the filters whose argument sets the size of what they build (`ljust:30000000`,
`rjust`, `center`, `stringformat`, `floatformat`) or whose time grows badly on hostile text (`urlize`);
`join` first checks what it would build. Every string value is inserted as JSON string content:
`json.dumps(value)[1:-1]`; true, false and null as the JSON literal (which `{% if %}` tests as the value);
a list or an object (a file) item by item; our own JSON (`*_json`) as it is. `mentions` says whether a
template uses a variable (what the REST destination's capabilities are read from).

A render is bounded (`RenderBudget`): MAILROOM_REST_TEMPLATE_SECONDS of time and
MAILROOM_REST_TEMPLATE_MAX_CHARS of output beyond eight times the request's own text, checked as every node of
the template renders; past either, `TemplateProblem` and nothing is sent. When a template is saved it must
render within those limits for a sample request, and for a stress request whose every text is 20 000
characters (what grows with the square of the description, such as a loop over it that prints it, fails
there), and it may not nest {% for %} loops.
"""

import json
import re
import time
from contextvars import ContextVar
from urllib.parse import quote

from django.conf import settings
from django.template import Context, Engine, Library, TemplateSyntaxError, defaultfilters, defaulttags
from django.template.defaulttags import ForNode
from django.utils.safestring import SafeString, mark_safe

from .settings import Url

PLACEHOLDER = re.compile(r"\{([A-Za-z_]*)\}")
DOTTED_PATH = r"[A-Za-z0-9_$@-]+(?:\.[A-Za-z0-9_$@-]+)*"
MAX_TEMPLATE_CHARS = 20_000
STRESS_CHARS = 20_000
# Output allowed per character of the request's own text (JSON escaping makes a control character six).
OUTPUT_PER_INPUT_CHAR = 8

SAFE_TAGS = (
    "comment",
    "cycle",
    "filter",
    "firstof",
    "for",
    "if",
    "ifchanged",
    "spaceless",
    "templatetag",
    "verbatim",
    "with",
    "widthratio",
)
REFUSED_FILTERS = {
    "random": "a retry must send the very same body",
    "ljust": "its argument sets the size of the text it builds",
    "rjust": "its argument sets the size of the text it builds",
    "center": "its argument sets the size of the text it builds",
    "stringformat": "its argument sets the size of the text it builds",
    "floatformat": "its argument sets the size of the text it builds",
    "urlize": "it is slow on hostile text",
    "urlizetrunc": "it is slow on hostile text",
}


class TemplateProblem(Exception):
    """A template that does not compile, render or give JSON; the message names neither values nor bodies."""


class RenderBudget:
    """The time and the output one render may take; `check` raises TemplateProblem past either."""

    def __init__(self, *, seconds: float, max_chars: int):
        self.seconds, self.max_chars = seconds, max_chars
        self.deadline = time.monotonic() + seconds
        self.left = max_chars
        self.exceeded: str | None = None

    def check(self, spend: int = 0) -> None:
        self.left -= spend
        if self.exceeded is None and self.left < 0:
            self.exceeded = f"the template rendered more than {self.max_chars} characters"
        if self.exceeded is None and time.monotonic() > self.deadline:
            self.exceeded = f"the template took longer than {self.seconds:g} s to render"
        if self.exceeded:
            raise TemplateProblem(self.exceeded)  # and again at every node, should a tag swallow it


_budget: ContextVar[RenderBudget | None] = ContextVar("rest_template_budget", default=None)


def _bounded_join(value, arg, autoescape=True):
    """`join`, refusing first what would outgrow the render's budget."""
    budget = _budget.get()
    if budget is not None:
        try:
            size = sum(len(str(item)) for item in value) + len(str(arg)) * max(0, len(value) - 1)
        except TypeError:
            size = 0  # not a sequence: join gives it back as it is
        budget.check(0 if size <= budget.left else budget.left + 1)
    return defaultfilters.join(value, arg, autoescape=autoescape)


_bounded_join.is_safe = getattr(defaultfilters.join, "is_safe", False)
_bounded_join.needs_autoescape = True


class _AdminEngine(Engine):
    default_builtins = []  # no loader tags; the safe tags and filters are added below


def _engine() -> Engine:
    library = Library()
    library.tags.update({name: defaulttags.register.tags[name] for name in SAFE_TAGS})
    library.filters.update(
        {name: function for name, function in defaultfilters.register.filters.items() if name not in REFUSED_FILTERS}
    )
    library.filters["join"] = _bounded_join
    engine = _AdminEngine(loaders=[], libraries={}, autoescape=False)
    engine.template_builtins = [library]
    return engine


ENGINE = _engine()


class RawJson(str):
    """JSON text made by us (`tags_json`, `cc_json`, `files_json`): inserted as is."""


class JsonLiteral(SafeString):
    """true, false or null as a template value: it renders as the JSON literal and tests as the value, so that
    `{% if public %}` is false for a private comment (the text "false" alone would be true)."""

    def __new__(cls, value):
        literal = super().__new__(cls, json.dumps(value))
        literal.value = value
        return literal

    def __bool__(self):
        return bool(self.value)


def json_text(value) -> str:
    """A value as it goes into a JSON template: a string as JSON string content (quotes, backslashes, control
    characters escaped), a number as a number, true/false/null as the literal, a list as a list of such values,
    an object (a file) as an object of such values (`{{ file.filename }}`)."""
    if isinstance(value, RawJson):
        return mark_safe(value)
    if isinstance(value, str):
        return mark_safe(json.dumps(value, ensure_ascii=False)[1:-1])
    if isinstance(value, (list, tuple)):
        return [json_text(item) for item in value]
    if isinstance(value, dict):
        return {str(name): json_text(item) for name, item in value.items()}
    if isinstance(value, bool) or value is None:
        return JsonLiteral(value)
    if isinstance(value, (int, float)):
        return mark_safe(json.dumps(value))
    return json_text(str(value))


def _children(node):
    for name in node.child_nodelists:
        yield from getattr(node, name, None) or ()


def _all_nodes(nodelist):
    for node in nodelist:
        yield node
        yield from _all_nodes(list(_children(node)))


def _bound(node) -> None:
    """Make `node` check the budget each time it renders; a leaf (text, a variable, a leaf tag) also spends
    what it output: everything a template outputs comes from its leaves."""
    render = node.render_annotated
    leaf = not any(True for _ in _children(node))

    def render_annotated(context):
        budget = _budget.get()
        if budget is not None:
            budget.check()
        output = render(context)
        if budget is not None and leaf:
            budget.check(len(output))
        return output

    node.render_annotated = render_annotated


def compile_template(source: str):
    """The template compiled by the restricted engine, every node bounded. Raises TemplateProblem."""
    try:
        template = ENGINE.from_string(source)
    except TemplateSyntaxError as exc:
        refused = re.match(r"Invalid filter: '(\w+)'", str(exc))
        if refused and refused.group(1) in REFUSED_FILTERS:
            name = refused.group(1)
            raise TemplateProblem(f"the filter {name} is not allowed: {REFUSED_FILTERS[name]}") from None
        raise TemplateProblem(f"template syntax error: {exc}") from None
    for node in _all_nodes(template.nodelist):
        _bound(node)
    return template


def input_chars(context: dict) -> int:
    """The request's own text in `context`, in characters."""
    total = 0
    for value in context.values():
        items = value if isinstance(value, (list, tuple)) else (value,)
        total += sum(len(str(item)) for item in items)
    return total


def render_json(source: str, context: dict, *, seconds: float | None = None, max_chars: int | None = None):
    """The template rendered with every value JSON-escaped, within the render budget, parsed as JSON.
    Raises TemplateProblem."""
    template = compile_template(source)
    seconds = settings.MAILROOM_REST_TEMPLATE_SECONDS if seconds is None else seconds
    if max_chars is None:
        max_chars = settings.MAILROOM_REST_TEMPLATE_MAX_CHARS + OUTPUT_PER_INPUT_CHAR * input_chars(context)
    text = render_text(
        template, {name: json_text(value) for name, value in context.items()}, seconds=seconds, max_chars=max_chars
    )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise TemplateProblem(
            f"the template did not render valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None


def render_text(template, values: dict, *, seconds: float, max_chars: int) -> str:
    """A template from `compile_template` rendered as it is (no escaping: the caller's values are text for a
    plain-text email, or already JSON-escaped by render_json), within the render budget. Raises TemplateProblem."""
    budget = RenderBudget(seconds=seconds, max_chars=max_chars)
    token = _budget.set(budget)
    try:
        text = template.render(Context(values, autoescape=False))
        budget.check()  # a tag may have swallowed the budget's exception: it stays exceeded
    except TemplateProblem:
        raise
    except TemplateSyntaxError as exc:
        raise TemplateProblem(f"template syntax error: {exc}") from None
    except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
        raise TemplateProblem(f"the template failed to render ({type(exc).__name__})") from None
    finally:
        _budget.reset(token)
    return text


def mentions(source, name: str) -> bool:
    """Does template `source` use the variable `name` (in a {{ }} or a {% %}, as itself or with a filter or an
    attribute: `{{ html }}`, `{% for file in files %}`, `{{ files_json }}` is `files_json`, not `files`)?"""
    if not isinstance(source, str):
        return False
    return re.search(r"\{[{%]((?![}%]\}).)*?(?<![\w.])" + re.escape(name) + r"(?!\w)", source, re.S) is not None


def fill_url(template: str, values: dict) -> str:
    """A URL template with each {name} replaced by the URL-quoted value (unknown names: a TemplateProblem)."""

    def replace(match):
        name = match.group(1)
        if name not in values:
            raise TemplateProblem(f"unknown placeholder {{{name}}}")
        return quote(str(values[name]), safe="")

    return PLACEHOLDER.sub(replace, template)


def at_path(document, path: str):
    """The value at a dotted path ("data.id", "result.0.sys_id"), or None when the path leads nowhere."""
    for part in path.split("."):
        if isinstance(document, dict) and part in document:
            document = document[part]
        elif isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        else:
            return None
    return document


# --- Settings checks (ticketing.destinations.settings.Anything) ---------------------------------------


def stressed(sample: dict) -> dict:
    """`sample` with every text repeated to STRESS_CHARS long (lists and our own JSON as they are)."""

    def long(value):
        if isinstance(value, RawJson) or not isinstance(value, str) or not value:
            return value
        unit = value + " "
        return (unit * (STRESS_CHARS // len(unit) + 1))[:STRESS_CHARS]

    return {name: long(value) for name, value in sample.items()}


def json_template_check(sample: dict):
    """A check for a JSON body template: it compiles without refused filters or nested loops, renders valid
    JSON for a sample request, and stays within the render budget for a stress request."""
    stress = stressed(sample)

    def errors(value) -> list[str]:
        if not isinstance(value, str) or not value.strip():
            return ["must be a template (text)"]
        if len(value) > MAX_TEMPLATE_CHARS:
            return [f"must be at most {MAX_TEMPLATE_CHARS} characters"]
        try:
            template = compile_template(value)
        except TemplateProblem as exc:
            return [str(exc)]
        if any(node.get_nodes_by_type(ForNode)[1:] for node in template.nodelist.get_nodes_by_type(ForNode)):
            return ["nested {% for %} loops are not allowed: what they render grows with the square of the text"]
        try:
            render_json(value, sample)
        except TemplateProblem as exc:
            return [f"{exc} (rendered for a sample request)"]
        try:
            render_json(value, stress)
        except TemplateProblem as exc:
            return [f"{exc} (rendered for a request whose texts are {STRESS_CHARS} characters long)"]
        return []

    return errors


def url_template_check(allowed: tuple[str, ...]):
    """A check for a URL template: an http(s) URL or a /path, with only the `allowed` {placeholders}."""

    def errors(value) -> list[str]:
        messages = Url(max_length=2000).errors(value)
        if messages:
            return messages
        unknown = sorted({name for name in PLACEHOLDER.findall(str(value)) if name not in allowed})
        if unknown:
            known = ", ".join("{" + name + "}" for name in allowed) or "none"
            return [f"unknown placeholder {{{unknown[0]}}} (known: {known})"]
        return []

    return errors


def header_check(value) -> list[str]:
    if not isinstance(value, dict):
        return ["must be an object of header name: value"]
    messages = []
    for name, template in value.items():
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", str(name)):
            messages.append(f"{name!r}: not a header name")
        elif not isinstance(template, str) or re.search(r"[\r\n]", template):
            messages.append(f"{name!r}: must be one line of text")
        elif any(placeholder != "secret" for placeholder in PLACEHOLDER.findall(template)):
            messages.append(f"{name!r}: the only placeholder is {{secret}}")
    return messages


def route_value_check(value) -> list[str]:
    if not isinstance(value, dict):
        return ["must be an object of name: value"]
    return [
        f"{key!r}: must be text or a number"
        for key, item in value.items()
        if isinstance(item, bool) or not isinstance(item, (str, int, float))
    ]
