"""One door per state machine (docs/design.md §6 "The intent state machine"): only the owners write `state`.

`Intent.state` is written by `ticketing.intents` (a module or a package) and
`InboxEvent.state` by `intake.services` (`ingestion`: the INSERT; `events`:
`transition_event`, `transition_events`). This test parses every module of the
three apps (migrations aside) and fails on any other write of a `state` field:

- `.update(state=...)`, `.create(state=...)`, `.get_or_create` /
  `.update_or_create` / `bulk_create` with `state=` (also as `**{"state": ...}`,
  `**changes` where `changes = {"state": ...}` in the module, or a
  `defaults={"state": ...}` key);
- a model constructed with it: `Intent(state=...)`, `InboxEvent(state=...)`;
- `bulk_update(..., ["state", ...])`;
- `x.state = ...` (or `setattr(x, "state", ...)`) in a function that also calls
  `x.save(...)`; an assignment to an object in hand that is never saved (keeping
  a copy in step with the row just updated) is not a write;
- raw SQL `UPDATE ... SET ... state = ...`.

The only other model with a `state` field is `BulkJob` (its door: `reconciliation/services/bulk_jobs.py`),
so every hit is one of the three.
Pure: no database.
"""

import ast
import re
from dataclasses import dataclass

from tests.support.source import ROOT, app_modules

OWNERS = (
    "intake/services/events.py",
    "intake/services/ingestion.py",
    "ticketing/intents.py",
    "ticketing/intents/",
    "reconciliation/services/bulk_jobs.py",
)
STATE_MODELS = {"Intent", "InboxEvent", "BulkJob"}
WRITE_METHODS = {
    "update",
    "create",
    "get_or_create",
    "update_or_create",
    "bulk_create",
    "acreate",
    "aupdate",
    "aget_or_create",
    "aupdate_or_create",
}
DEFAULTS_KWARGS = {"defaults", "create_defaults"}
RAW_STATE_UPDATE = re.compile(r"\bUPDATE\b.*\bSET\b.*\bstate\s*=", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Write:
    path: str
    line: int
    what: str
    model: str = ""  # "Intent" or "InboxEvent" when the statement names it (`InboxEvent.objects...update(...)`)

    def __str__(self):
        return f"{self.path}:{self.line}: {self.what}"


def _is_state_key(node) -> bool:
    return isinstance(node, ast.Constant) and node.value == "state"


def _dict_has_state(node) -> bool:
    return isinstance(node, ast.Dict) and any(_is_state_key(key) for key in node.keys)


def _state_dict(node) -> bool:
    """{"state": ...} or dict(state=...)."""
    return _dict_has_state(node) or (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "dict"
        and any(k.arg == "state" for k in node.keywords)
    )


def _state_dict_names(tree) -> set[str]:
    """Names bound to a dict that sets state somewhere in the module (`changes = {"state": ...}`)."""
    return {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _state_dict(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _sets_state(call: ast.Call, state_dicts: frozenset = frozenset()) -> bool:
    for keyword in call.keywords:
        if keyword.arg == "state":
            return True
        if keyword.arg is None and (
            _state_dict(keyword.value)  # **{"state": ...}
            or isinstance(keyword.value, ast.Name)
            and keyword.value.id in state_dicts
        ):
            return True
        if keyword.arg in DEFAULTS_KWARGS and _dict_has_state(keyword.value):
            return True
    return False


def _root_model(call: ast.Call) -> str:
    """The model a call chain starts from: "InboxEvent" for `InboxEvent.objects.filter(...).update(...)`."""
    node = call.func
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            break
    return node.id if isinstance(node, ast.Name) and node.id in STATE_MODELS else ""


def _callee_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _state_targets(node) -> list[str]:
    """The objects whose `.state` an assignment sets (as source text), e.g. ["event"] for `event.state = x`."""
    targets = []
    if isinstance(node, ast.Assign):
        candidates = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        candidates = [node.target]
    else:
        return targets
    while candidates:
        target = candidates.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            candidates.extend(target.elts)
        elif isinstance(target, ast.Attribute) and target.attr == "state":
            targets.append(ast.unparse(target.value))
    return targets


def _saved_objects(scope) -> set[str]:
    saved = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("save", "asave"):
            saved.add(ast.unparse(node.func.value))
    return saved


def state_writes(source: str, path: str = "<snippet>") -> list[Write]:
    """Every write of a `state` field in `source`."""
    tree = ast.parse(source, filename=path)
    state_dicts = frozenset(_state_dict_names(tree))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _callee_name(node)
            if name in WRITE_METHODS and _sets_state(node, state_dicts):
                found.append(Write(path, node.lineno, f".{name}(...) sets state", _root_model(node)))
            elif name in STATE_MODELS and _sets_state(node):
                found.append(Write(path, node.lineno, f"{name}(state=...) constructed", name))
            elif name in ("bulk_update", "abulk_update") and any(
                isinstance(arg, (ast.List, ast.Tuple, ast.Set)) and any(_is_state_key(e) for e in arg.elts)
                for arg in [*node.args, *(k.value for k in node.keywords)]
            ):
                found.append(Write(path, node.lineno, "bulk_update of state"))
            elif name == "setattr" and len(node.args) >= 2 and _is_state_key(node.args[1]):
                found.append(Write(path, node.lineno, "setattr(..., 'state', ...)"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and RAW_STATE_UPDATE.search(node.value):
            found.append(Write(path, node.lineno, "raw SQL UPDATE ... SET state"))
    # `x.state = ...` counts when the same function saves `x`.
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        saved = _saved_objects(scope)
        for node in ast.walk(scope):
            for target in _state_targets(node):
                if target in saved:
                    found.append(Write(path, node.lineno, f"{target}.state = ... then {target}.save()"))
    return sorted(set(found), key=lambda w: (w.path, w.line, w.what))


def is_owner(relative: str) -> bool:
    return any(relative == owner or (owner.endswith("/") and relative.startswith(owner)) for owner in OWNERS)


def owned_model(relative: str) -> str:
    """The one model whose state an owner writes."""
    if relative == "reconciliation/services/bulk_jobs.py":
        return "BulkJob"
    return "InboxEvent" if relative.startswith("intake/services/") else "Intent"


# --- the rule ------------------------------------------------------------------------


def test_only_the_owners_write_intent_or_event_state():
    scanned, writes = 0, []
    for relative, path in app_modules():
        scanned += 1
        found = state_writes(path.read_text(encoding="utf-8"), relative)
        if is_owner(relative):
            # An owner writes its own machine only: ticketing.intents moves events through intake.
            found = [w for w in found if w.model and w.model != owned_model(relative)]
        writes.extend(found)
    assert scanned > 20, "the apps were not found: the check would prove nothing"
    assert not writes, (
        "state written outside ticketing.intents / intake.services; call a transition "
        "function instead:\n" + "\n".join(map(str, writes))
    )


def test_the_owners_are_where_the_writes_are():
    """The checker sees the owners' own writes: it is looking at the right code, and the owners exist."""
    owner_writes = [
        w
        for relative, path in app_modules()
        if is_owner(relative)
        for w in state_writes(path.read_text(encoding="utf-8"), relative)
    ]
    assert any(w.path.startswith("ticketing/intents") for w in owner_writes)
    assert any(w.path.startswith("intake/services/") for w in owner_writes)


# --- the checker catches what it should, and only that --------------------------------

BAD_SNIPPET = """
from django.db import connection
from intake.models import InboxEvent
from ticketing.models import Intent

def sneaky(intent_id, event_id, to_state):
    Intent.objects.filter(pk=intent_id).update(state="held")
    InboxEvent.objects.filter(pk=event_id, state="ready").update(state=to_state, updated_at=None)
    Intent.objects.filter(pk=intent_id).update(**{"state": "pending"})
    Intent.objects.create(idempotency_key="k", state="held")
    Intent.objects.update_or_create(pk=intent_id, defaults={"state": "failed"})
    Intent.objects.bulk_create([Intent(idempotency_key="k", state="held")], ignore_conflicts=True)
    Intent.objects.bulk_update([], ["state", "attempts"])
    changes = {"state": to_state, "attempts": 0}
    Intent.objects.filter(pk=intent_id).update(**changes)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ticketing_intent SET attempts = 0, state = 'pending' WHERE id = %s", [intent_id])

def by_save(event_id):
    event = InboxEvent.objects.get(pk=event_id)
    event.state = "completed"
    event.save(update_fields=["state"])

def by_setattr(intent):
    setattr(intent, "state", "failed")
"""

GOOD_SNIPPET = """
from intake.models import InboxEvent
from ticketing.models import Intent

def reads_and_copies(event, event_id):
    open_ones = InboxEvent.objects.filter(state__in=["received", "ready"]).exclude(state="completed")
    Intent.objects.filter(inbox_event_id=event_id, state="unknown").update(next_attempt_at=None)
    Intent.objects.filter(pk=1).values("state")
    event.state = "ready"          # the copy in hand, in step with a row updated elsewhere; never saved
    other = InboxEvent.objects.get(pk=event_id)
    other.subject = "x"
    other.save()
    details = {}
    details.update(flags=["a"])
    return open_ones, "SELECT state FROM intake_inboxevent"
"""


def test_the_checker_catches_each_kind_of_write():
    writes = state_writes(BAD_SNIPPET)
    lines = {w.line for w in writes}
    # every write of `sneaky` (lines 7-15, 17), the assignment before the save (21) and the setattr (25)
    assert lines == {7, 8, 9, 10, 11, 12, 13, 15, 17, 21, 25}, "\n".join(map(str, writes))
    assert any("then event.save()" in w.what for w in writes)
    assert any("constructed" in w.what for w in writes)  # Intent(state=...) inside bulk_create


def test_the_checker_lets_reads_filters_and_unsaved_copies_pass():
    assert state_writes(GOOD_SNIPPET) == []


def test_the_checker_would_fail_the_rule_for_a_bad_module_outside_the_owners():
    assert not is_owner("ticketing/replay.py") and not is_owner("intake/normalize.py")
    assert is_owner("ticketing/intents/core.py") and is_owner("intake/services/events.py")
    assert not is_owner("intake/services/sweeps.py")
    assert state_writes(BAD_SNIPPET, "ticketing/replay.py")


def test_the_checker_names_the_model_a_write_starts_from():
    """So an owner that wrote the other machine's state (intents updating an event) is caught too."""
    models = {w.line: w.model for w in state_writes(BAD_SNIPPET)}
    assert models[7] == "Intent" and models[8] == "InboxEvent" and models[12] == "Intent"


# --- Mailbox.link_state: intake.mailbox_health is its one door ----------------------------------------------------

LINK_FIELDS = {"link_state", "link_state_since"}
LINK_OWNER = "intake/mailbox_health.py"


def link_state_writes(source: str, path: str) -> list[Write]:
    """Keyword writes (`.update(link_state=...)`, `Mailbox(link_state=...)`), `x.link_state = ...` and raw SQL."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and any(k.arg in LINK_FIELDS for k in node.keywords)
            and (
                isinstance(node.func, ast.Name)  # a model constructed with it
                or isinstance(node.func, ast.Attribute)
                and node.func.attr in WRITE_METHODS
            )
        ):
            found.append(Write(path, node.lineno, "a call that sets link_state"))
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        if any(isinstance(t, ast.Attribute) and t.attr in LINK_FIELDS for t in targets):
            found.append(Write(path, node.lineno, "an assignment to link_state"))
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.search(r"\bUPDATE\b.*\bSET\b.*\blink_state\s*=", node.value, re.IGNORECASE | re.DOTALL)
        ):
            found.append(Write(path, node.lineno, "raw SQL setting link_state"))
    return found


def test_only_mailbox_health_moves_a_mailboxs_link_state():
    writes = [
        w
        for relative, path in app_modules()
        if relative != LINK_OWNER
        for w in link_state_writes(path.read_text(), relative)
    ]
    assert writes == [], "\n".join(map(str, writes))
    owner = (ROOT / LINK_OWNER).read_text()
    assert link_state_writes(owner, LINK_OWNER), "the owner is where the writes are"


def test_the_link_state_checker_catches_each_kind_of_write():
    bad = (
        "Mailbox.objects.filter(pk=1).update(link_state='up')\n"
        "mailbox.link_state = 'down'\n"
        "cursor.execute('UPDATE intake_mailbox SET link_state = %s', ['up'])\n"
    )
    assert len(link_state_writes(bad, "x.py")) == 3
    assert link_state_writes("Mailbox.objects.filter(link_state='up').count()\nx = m.link_state\n", "x.py") == []
