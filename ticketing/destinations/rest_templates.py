"""The templates a generic REST destination's admin writes: URL templates with {placeholders} and JSON
bodies in Django's template language, rendered by a restricted engine, and dotted paths into answers.

Templates come from admins, so the engine has no loaders, no {% load %}, no {% include %}, no
{% debug %}, {% url %}, {% csrf_token %} or {% now %}, and no `random` filter (a retry must send the
very same body). Every string value is inserted as JSON string content: `json.dumps(value)[1:-1]`.
"""
import json
import re
from urllib.parse import quote

from django.template import Context, Engine, Library, TemplateSyntaxError, defaultfilters, defaulttags
from django.utils.safestring import mark_safe

from .settings import Url

PLACEHOLDER = re.compile(r"\{([A-Za-z_]*)\}")
DOTTED_PATH = r"[A-Za-z0-9_$@-]+(?:\.[A-Za-z0-9_$@-]+)*"
MAX_TEMPLATE_CHARS = 20_000

SAFE_TAGS = ("comment", "cycle", "filter", "firstof", "for", "if", "ifchanged", "spaceless", "templatetag",
             "verbatim", "with", "widthratio")
UNSAFE_FILTERS = ("random",)


class _AdminEngine(Engine):
    default_builtins = []   # no loader tags; the safe tags and filters are added below


def _engine() -> Engine:
    library = Library()
    library.tags.update({name: defaulttags.register.tags[name] for name in SAFE_TAGS})
    library.filters.update({name: function for name, function in defaultfilters.register.filters.items()
                            if name not in UNSAFE_FILTERS})
    engine = _AdminEngine(loaders=[], libraries={}, autoescape=False)
    engine.template_builtins = [library]
    return engine


ENGINE = _engine()


class RawJson(str):
    """JSON text made by us (`tags_json`): inserted as is."""


class TemplateProblem(Exception):
    """A template that does not compile, render or give JSON; the message names neither values nor bodies."""


def json_text(value) -> str:
    """A value as it goes into a JSON template: a string as JSON string content (quotes, backslashes, control
    characters escaped), a number as a number, a list as a list of such strings."""
    if isinstance(value, RawJson):
        return mark_safe(value)
    if isinstance(value, str):
        return mark_safe(json.dumps(value, ensure_ascii=False)[1:-1])
    if isinstance(value, (list, tuple)):
        return [json_text(item) for item in value]
    if isinstance(value, bool) or value is None:
        return mark_safe(json.dumps(value))
    if isinstance(value, (int, float)):
        return mark_safe(json.dumps(value))
    return json_text(str(value))


def render_json(source: str, context: dict):
    """The template rendered with every value JSON-escaped, parsed as JSON. Raises TemplateProblem."""
    try:
        template = ENGINE.from_string(source)
        text = template.render(Context({name: json_text(value) for name, value in context.items()},
                                       autoescape=False))
    except TemplateSyntaxError as exc:
        raise TemplateProblem(f"template syntax error: {exc}") from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise TemplateProblem(f"the template failed to render ({type(exc).__name__})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise TemplateProblem(f"the template did not render valid JSON (line {exc.lineno}, column {exc.colno})") \
            from None


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

def json_template_check(sample: dict):
    """A check for a JSON body template: it compiles, and renders valid JSON for a sample request."""
    def errors(value) -> list[str]:
        if not isinstance(value, str) or not value.strip():
            return ["must be a template (text)"]
        if len(value) > MAX_TEMPLATE_CHARS:
            return [f"must be at most {MAX_TEMPLATE_CHARS} characters"]
        try:
            render_json(value, sample)
        except TemplateProblem as exc:
            return [f"{exc} (rendered for a sample request)"]
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
    return [f"{key!r}: must be text or a number" for key, item in value.items()
            if isinstance(item, bool) or not isinstance(item, (str, int, float))]
