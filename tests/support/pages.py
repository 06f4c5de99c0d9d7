"""Chromium pages: a fresh page that collects console errors, and the console walk.

`walk(page, url, name)` loads a page at each width of WIDTHS and returns every problem found on it (overflow,
responses >= 400, console and page errors, CSP violations, a Python repr as text), with a screenshot in
SCREENSHOTS; `new_context_page(browser)` opens the page it needs (tests/test_console_walk.py).
"""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.browser import REPO_ROOT

WIDTHS = (1400, 800)
SCREENSHOTS = Path(os.environ.get("MAILROOM_WALK_SCREENSHOTS") or REPO_ROOT / "var" / "screenshots")
REPR = re.compile(r"\{'|\[\{|\bNone\b")

# Registered before any page script: CSP violations are reported here as well as on the console.
WATCH_VIOLATIONS = """
window.__walkViolations = [];
document.addEventListener('securitypolicyviolation',
    (e) => window.__walkViolations.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline')));
"""

# The element furthest past the window's right edge that no scrolling box of its own clips.
WIDEST = """() => {
  const limit = window.innerWidth + 1;
  const clipped = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== 'visible' && p.getBoundingClientRect().right <= limit) return true;
    }
    return false;
  };
  let worst = null, edge = limit;
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (!r.width || r.right + window.scrollX <= edge || clipped(el)) continue;
    worst = el; edge = r.right + window.scrollX;
  }
  if (!worst) return '';
  const id = worst.id ? '#' + worst.id : '';
  const cls = worst.classList.length ? '.' + [...worst.classList].slice(0, 3).join('.') : '';
  const text = (worst.innerText || '').replace(/\\s+/g, ' ').trim().slice(0, 40);
  return `${worst.tagName.toLowerCase()}${id}${cls} (${Math.round(worst.getBoundingClientRect().width)} px wide,`
       + ` right edge at ${Math.round(edge)} px)` + (text ? ` "${text}"` : '');
}"""


@dataclass
class Watch:
    """What the browser reported since the last `reset`: responses >= 400, console errors, page errors."""

    bad_responses: list = field(default_factory=list)  # (status, url, resource type, method)
    errors: list = field(default_factory=list)

    def reset(self):
        self.bad_responses.clear()
        self.errors.clear()


def watched(page) -> Watch:
    watch = Watch()
    page.on(
        "response",
        lambda r: (
            r.status >= 400 and watch.bad_responses.append((r.status, r.url, r.request.resource_type, r.request.method))
        ),
    )
    page.on("console", lambda m: m.type == "error" and watch.errors.append(f"console error: {m.text[:200]}"))
    page.on("pageerror", lambda exc: watch.errors.append(f"page error: {str(exc)[:200]}"))
    page.walk_watch = watch
    return watch


def _path(url: str) -> str:
    return re.sub(r"^https?://[^/]+", "", url)


def walk(page, url, name, *, submit=None, invalid=False) -> list[str]:
    """Load `url` at each width and return every problem found, one readable line each.

    `submit(page, width)` then fills and submits a form on it; `invalid=True` says that submit is meant to
    be refused: its answer must be 200 or 400 and show the form's errors. A valid submit must leave the
    form (a redirect) without errors.
    """
    watch = page.walk_watch
    problems = []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        where = f"{name} @{width}px"
        page.set_viewport_size({"width": width, "height": 900})
        watch.reset()
        try:
            response = page.goto(url)
            page.wait_for_load_state("load")
            if submit is not None:
                with page.expect_navigation() as navigation:
                    submit(page, width)
                response = navigation.value
                page.wait_for_load_state("load")
        except Exception as exc:  # a timeout or a missing field: the page is not what the walk expects
            problems.append(f"{where}: could not load or submit ({type(exc).__name__}: {str(exc)[:160]})")
            continue
        problems += _form_outcome(page, response, where, submit, invalid)
        problems += _response_problems(watch, response, where, invalid)
        # Chromium also logs every failed load on the console: the response line above already says it.
        problems += [
            f"{where}: {error}"
            for error in watch.errors
            if not (watch.bad_responses and "Failed to load resource" in error)
        ]
        problems += [
            f"{where}: CSP violation: {v}"
            for v in page.evaluate("window.__walkViolations || []")
            if not any(v.split(" ")[0] in e for e in watch.errors)
        ]
        if page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1"):
            wide = page.evaluate("document.documentElement.scrollWidth")
            problems.append(
                f"{where}: horizontal overflow: the page is {wide} px wide; widest: "
                f"{page.evaluate(WIDEST) or 'no single element (margins?)'}"
            )
        text = page.inner_text("body")
        for match in list(REPR.finditer(text))[:3]:
            context = " ".join(text[max(0, match.start() - 30) : match.end() + 30].split())
            problems.append(f"{where}: repr as text {match.group()!r}: \u201c{context}\u201d")
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    return problems


def _form_outcome(page, response, where, submit, invalid) -> list[str]:
    if submit is None:
        return []
    errors = page.locator(".errornote, .errorlist").all_inner_texts()
    if invalid and not errors:
        return [
            f"{where}: the invalid submit showed no error (answered {response.status if response else '?'}, "
            f"now at {_path(page.url)})"
        ]
    if not invalid and errors:
        return [f"{where}: the valid submit was refused: {' / '.join(' '.join(e.split()) for e in errors)[:200]}"]
    if not invalid and response is not None and response.request.method == "POST":
        return [f"{where}: the valid submit answered {response.status} without leaving the form"]
    return []


def _response_problems(watch, response, where, invalid) -> list[str]:
    problems = []
    for status, url, kind, method in watch.bad_responses:
        # The refused form itself may answer 400 with its errors (checked by _form_outcome).
        if invalid and kind == "document" and method == "POST" and status == 400:
            continue
        problems.append(f"{where}: HTTP {status} for {kind} {method} {_path(url)}")
    if response is not None and response.status >= 400 and not watch.bad_responses:
        problems.append(f"{where}: HTTP {response.status} for {_path(response.url)}")
    return problems


def new_context_page(browser):
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    context.set_default_timeout(15_000)
    context.add_init_script(WATCH_VIOLATIONS)
    page = context.new_page()
    watched(page)
    return context, page


def new_page(browser, width):
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    return context, page, errors
