"""FakeDesk, the fault-injecting Zendesk stand-in, spoken to over real HTTP on 127.0.0.1.

The desks come from the `desk` / `desk_factory` fixtures of `fakedesk.pytest_plugin`
and are steered through their control API with the plugin's client.
"""

import ast
import email.utils
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from fakedesk import ControlError, DeskClient, parse_fault

REPO = Path(__file__).resolve().parent.parent
TOKEN = "sekrit"
AUTH = ("agent@example.com/token", TOKEN)

pytestmark = pytest.mark.fakedesk(token=TOKEN)


def ticket_body(external_id="ext-1", subject="Printer on fire", body="It is on fire.", **extra):
    return {
        "ticket": {
            "subject": subject,
            "comment": {"body": body},
            "external_id": external_id,
            "requester": {"email": "jane@example.com", "name": "Jane"},
            **extra,
        }
    }


def create(desk, key=None, timeout=5, **kwargs):
    headers = {"Idempotency-Key": key} if key else {}
    return requests.post(
        f"{desk.url}/api/v2/tickets.json", json=ticket_body(**kwargs), headers=headers, auth=AUTH, timeout=timeout
    )


def comment(desk, ticket_id, text, key=None, timeout=5):
    headers = {"Idempotency-Key": key} if key else {}
    return requests.put(
        f"{desk.url}/api/v2/tickets/{ticket_id}.json",
        json={"ticket": {"comment": {"body": text, "public": True}}},
        headers=headers,
        auth=AUTH,
        timeout=timeout,
    )


def tickets(desk):
    return desk.tickets()


def plan(desk, *faults, random_spec=None):
    desk.set_plan(faults, random_spec=random_spec)


# --- Creating tickets and idempotency keys ------------------------------------


def test_create_answers_201_with_the_ticket_and_ids_count_from_one(desk):
    first = create(desk, key="k-1", external_id="ext-1", tags=["email"])
    second = create(desk, key="k-2", external_id="ext-2")

    assert first.status_code == 201
    ticket = first.json()["ticket"]
    assert ticket["id"] == 1
    assert ticket["status"] == "new"
    assert ticket["external_id"] == "ext-1"
    assert ticket["subject"] == "Printer on fire"
    assert ticket["tags"] == ["email"]
    assert ticket["url"] == f"{desk.url}/api/v2/tickets/1.json"
    assert first.headers["x-idempotency-lookup"] == "miss"
    assert second.json()["ticket"]["id"] == 2
    # The description is the ticket's first comment, as in Zendesk.
    assert [c["body"] for c in tickets(desk)[0]["comments"]] == ["It is on fire."]


def test_replay_with_the_same_key_and_body_returns_the_original_ticket(desk):
    first = create(desk, key="k-1")
    replay = create(desk, key="k-1")

    assert replay.status_code == 201
    assert replay.headers["x-idempotency-lookup"] == "hit"
    assert replay.json() == first.json()
    assert len(tickets(desk)) == 1
    log = desk.requests_log()
    assert [(r["idempotency_lookup"], r["committed"]) for r in log] == [("miss", True), ("hit", False)]


def test_same_key_with_another_body_is_an_idempotent_request_error(desk):
    create(desk, key="k-1", subject="one")
    other = create(desk, key="k-1", subject="another")

    assert other.status_code == 400
    assert other.json()["error"] == "IdempotentRequestError"
    assert [t["subject"] for t in tickets(desk)] == ["one"]


def test_key_is_forgotten_after_the_retention_window(desk):
    desk.set_idempotency(retention_seconds=0.3)
    first = create(desk, key="k-1")
    assert desk.advance_clock(0.4) == 0.4
    late = create(desk, key="k-1")

    assert late.status_code == 201
    assert late.headers["x-idempotency-lookup"] == "miss"
    assert late.json()["ticket"]["id"] != first.json()["ticket"]["id"]
    assert len(tickets(desk)) == 2


def test_with_idempotency_off_every_post_creates(desk):
    settings = desk.set_idempotency(enabled=False)
    assert settings == {"enabled": False, "retention_seconds": 7200.0}

    first, second = create(desk, key="k-1"), create(desk, key="k-1")

    assert first.status_code == second.status_code == 201
    assert "x-idempotency-lookup" not in second.headers
    assert [t["id"] for t in tickets(desk)] == [1, 2]


def test_two_clients_racing_with_one_key_make_one_ticket(desk):
    answers = []

    def post():
        answers.append(create(desk, key="raced"))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert {a.status_code for a in answers} == {201}
    assert {a.json()["ticket"]["id"] for a in answers} == {1}
    assert sorted(a.headers["x-idempotency-lookup"] for a in answers) == ["hit"] * 7 + ["miss"]
    assert len(tickets(desk)) == 1


def test_an_invalid_ticket_is_refused_with_record_invalid_and_its_key_stays_free(desk):
    bad = requests.post(
        f"{desk.url}/api/v2/tickets.json",
        auth=AUTH,
        headers={"Idempotency-Key": "k-1"},
        json={"ticket": {"subject": "no body", "comment": {"body": " "}}},
        timeout=5,
    )
    assert bad.status_code == 422
    assert bad.json()["error"] == "RecordInvalid"
    assert "description" in bad.json()["details"]
    assert tickets(desk) == []
    # Only a success is remembered: the corrected request may use the same key.
    assert create(desk, key="k-1").status_code == 201


# --- Reading tickets ----------------------------------------------------------------


def test_list_by_external_id_show_and_not_found(desk):
    create(desk, external_id="dup")
    create(desk, external_id="other")
    create(desk, external_id="dup")

    listed = requests.get(f"{desk.url}/api/v2/tickets.json", params={"external_id": "dup"}, auth=AUTH, timeout=5)
    assert listed.status_code == 200
    assert listed.json()["count"] == 2
    assert [t["id"] for t in listed.json()["tickets"]] == [1, 3]

    shown = requests.get(f"{desk.url}/api/v2/tickets/3.json", auth=AUTH, timeout=5)
    assert shown.status_code == 200 and shown.json()["ticket"]["external_id"] == "dup"
    assert requests.get(f"{desk.url}/api/v2/tickets/99.json", auth=AUTH, timeout=5).status_code == 404


def test_comments_are_added_listed_and_idempotent(desk):
    ticket_id = create(desk).json()["ticket"]["id"]

    added = comment(desk, ticket_id, "Still on fire.", key="c-1")
    replay = comment(desk, ticket_id, "Still on fire.", key="c-1")
    listed = requests.get(f"{desk.url}/api/v2/tickets/{ticket_id}/comments.json", auth=AUTH, timeout=5)

    assert added.status_code == 200
    assert added.json()["ticket"]["id"] == ticket_id
    [event] = added.json()["audit"]["events"]
    assert event["type"] == "Comment" and event["body"] == "Still on fire."
    assert replay.headers["x-idempotency-lookup"] == "hit"
    assert replay.json()["audit"]["events"][0]["id"] == event["id"]
    assert [c["body"] for c in listed.json()["comments"]] == ["It is on fire.", "Still on fire."]
    assert comment(desk, 99, "nobody home").status_code == 404


# --- Authentication -------------------------------------------------------------------


def test_a_token_server_requires_basic_auth_with_that_token(desk):
    url = f"{desk.url}/api/v2/tickets.json"
    no_auth = requests.post(url, json=ticket_body(), timeout=5)
    wrong = requests.post(url, json=ticket_body(), auth=("agent@example.com/token", "nope"), timeout=5)
    password = requests.post(url, json=ticket_body(), auth=("agent@example.com", TOKEN), timeout=5)

    for answer in (no_auth, wrong, password):
        assert answer.status_code == 401
        assert answer.json() == {"error": "Couldn't authenticate you"}
    assert requests.get(f"{url}?external_id=x", timeout=5).status_code == 401
    assert tickets(desk) == []  # the control API needs no auth
    assert create(desk).status_code == 201


def test_without_a_token_any_auth_is_accepted(desk_factory):
    open_desk = desk_factory(token=None)
    answer = requests.post(f"{open_desk.url}/api/v2/tickets.json", json=ticket_body(), timeout=5)
    assert answer.status_code == 201


# --- Faults ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, status, error",
    [
        ("rate_limit:2", 429, "TooManyRequests"),
        ("unavailable_503:5", 503, "ServiceUnavailable"),
        ("unavailable_503", 503, "ServiceUnavailable"),
        ("error_500", 500, "InternalServerError"),
        ("reject_422", 422, "RecordInvalid"),
        ("unauthorized_401", 401, "Couldn't authenticate you"),
    ],
)
def test_refusing_faults_answer_and_write_nothing(desk, fault, status, error):
    plan(desk, fault)
    answer = create(desk, key="k-1")

    assert answer.status_code == status
    assert answer.json()["error"] == error
    assert tickets(desk) == []
    [entry] = desk.requests_log()
    assert (entry["fault"], entry["status"], entry["committed"]) == (fault, status, False)
    # The plan is used up: the next request is answered normally, and its key was never taken.
    assert create(desk, key="k-1").headers["x-idempotency-lookup"] == "miss"


def test_fault_headers_and_details(desk):
    plan(desk, "rate_limit:2", "rate_limit_date:30", "unavailable_503:5", "unavailable_503", "reject_422")

    assert create(desk).headers["Retry-After"] == "2"
    dated = email.utils.parsedate_to_datetime(create(desk).headers["Retry-After"])
    assert 25 <= dated.timestamp() - time.time() <= 31
    assert create(desk).headers["Retry-After"] == "5"
    assert "Retry-After" not in create(desk).headers
    assert create(desk).json()["details"] == {"requester": [{"description": "Requester email is invalid"}]}


def test_drop_before_commit_closes_the_connection_and_writes_nothing(desk):
    plan(desk, "drop_before_commit")
    with pytest.raises(requests.ConnectionError):
        create(desk, key="k-1")

    assert tickets(desk) == []
    [entry] = desk.requests_log()
    assert (entry["fault"], entry["status"], entry["committed"]) == ("drop_before_commit", None, False)


def test_drop_after_commit_writes_then_closes_and_a_replay_hits(desk):
    plan(desk, "drop_after_commit")
    with pytest.raises(requests.ConnectionError):
        create(desk, key="k-1")

    [ticket] = tickets(desk)
    assert ticket["external_id"] == "ext-1"
    replay = create(desk, key="k-1")
    assert replay.headers["x-idempotency-lookup"] == "hit"
    assert replay.json()["ticket"]["id"] == ticket["id"]
    assert len(tickets(desk)) == 1


def test_faults_also_apply_to_comments(desk):
    ticket_id = create(desk).json()["ticket"]["id"]
    plan(desk, "error_500", "drop_after_commit")

    assert comment(desk, ticket_id, "first try", key="c-1").status_code == 500
    with pytest.raises(requests.ConnectionError):
        comment(desk, ticket_id, "second try", key="c-2")

    assert [c["body"] for c in tickets(desk)[0]["comments"]] == ["It is on fire.", "second try"]


def test_stall_after_commit_outlasts_the_client_but_the_ticket_exists(desk):
    plan(desk, "stall_after_commit:3")
    started = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        create(desk, key="k-1", timeout=(1, 0.3))

    assert time.monotonic() - started < 2
    assert [t["external_id"] for t in tickets(desk)] == ["ext-1"]


def test_stall_before_commit_writes_after_the_client_gave_up(desk):
    plan(desk, "stall_before_commit:0.6")
    with pytest.raises(requests.ReadTimeout):
        create(desk, key="k-1", timeout=(1, 0.2))

    assert tickets(desk) == []  # the write is still on its way
    time.sleep(0.8)
    assert [t["external_id"] for t in tickets(desk)] == ["ext-1"]


def test_the_plan_is_fifo_then_ok_and_reads_do_not_consume_it(desk):
    plan(desk, "error_500", "rate_limit:1")
    assert desk.plan() == {"faults": ["error_500", "rate_limit:1"], "random": None}

    requests.get(f"{desk.url}/api/v2/tickets.json", auth=AUTH, timeout=5)
    assert [create(desk).status_code for _ in range(3)] == [500, 429, 201]
    assert desk.plan()["faults"] == []


@pytest.mark.parametrize(
    "payload",
    [
        {"faults": ["explode"]},
        {"faults": ["rate_limit"]},
        {"faults": ["error_500:3"]},
        {"random": {"seed": 1, "weights": {"error_500": 0.8, "reject_422": 0.5}}},
        {"random": {"seed": "x", "weights": {}}},
    ],
)
def test_a_bad_plan_is_refused(desk, payload):
    with pytest.raises(ControlError) as refused:
        desk.control("plan", payload)
    answer = refused.value
    assert answer.status == 400
    assert answer.body["error"] == "BadPlan"


def test_parse_fault():
    assert parse_fault("stall_after_commit:2.5").seconds == 2.5
    assert parse_fault("ok").name == "ok"
    with pytest.raises(ValueError):
        parse_fault("rate_limit:-1")


def run_random_plan(desk, seed, requests_count=40):
    desk.reset()
    weights = {"error_500": 0.2, "reject_422": 0.1, "rate_limit:1": 0.1, "drop_after_commit": 0.1}
    plan(desk, random_spec={"seed": seed, "weights": weights})
    statuses = []
    for index in range(requests_count):
        try:
            statuses.append(create(desk, key=f"k-{index}").status_code)
        except requests.ConnectionError:
            statuses.append("dropped")
    faults = [entry["fault"] for entry in desk.requests_log()]
    return faults, statuses, len(tickets(desk))


def test_the_random_plan_is_deterministic_for_a_seed(desk):
    faults, statuses, ticket_count = run_random_plan(desk, seed=7)
    again = run_random_plan(desk, seed=7)
    other = run_random_plan(desk, seed=8)

    assert (faults, statuses, ticket_count) == again
    assert faults != other[0]
    assert {"ok", "error_500", "drop_after_commit"} <= set(faults)
    # drop_after_commit writes; the refusing faults do not.
    assert ticket_count == faults.count("ok") + faults.count("drop_after_commit")


def test_reset_forgets_everything_and_ids_start_again(desk):
    create(desk, key="k-1")
    plan(desk, "error_500", "error_500")
    create(desk, key="k-2")

    assert desk.reset() == {"reset": True}

    assert tickets(desk) == []
    assert desk.requests_log() == []
    assert desk.plan()["faults"] == []
    answer = create(desk, key="k-1")
    assert answer.json()["ticket"]["id"] == 1
    assert answer.headers["x-idempotency-lookup"] == "miss"


# --- Persistence and the command line -------------------------------------------------


def test_tickets_and_keys_survive_a_restart_on_the_same_file(tmp_path, desk_factory):
    db = str(tmp_path / "desk.sqlite3")
    first = desk_factory(db_path=db)
    create(first, key="k-1", external_id="kept")
    first.stop()
    second = desk_factory(db_path=db)
    replay = create(second, key="k-1", external_id="kept")
    assert replay.headers["x-idempotency-lookup"] == "hit"
    assert [t["external_id"] for t in tickets(second)] == ["kept"]
    assert create(second, external_id="new").json()["ticket"]["id"] == 2


def start_process(command):
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = process.stdout.readline()
    if not line.startswith("FakeDesk listening on "):
        process.kill()
        pytest.fail(f"fakedesk did not start: {line!r} {process.stderr.read()}")
    return process, line.split()[-1]


def stop_process(process):
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert "FakeDesk stopped" in process.stdout.read()


@pytest.mark.parametrize(
    "launcher",
    [
        [sys.executable, "manage.py", "fakedesk"],
        [sys.executable, "-m", "fakedesk"],
    ],
    ids=["manage.py", "python -m"],
)
def test_the_server_runs_as_a_process_until_sigterm_and_keeps_its_file(tmp_path, launcher):
    command = launcher + ["--port", "0", "--db", str(tmp_path / "desk.sqlite3"), "--token", TOKEN]

    process, url = start_process(command)
    try:
        server = DeskClient(url, token=TOKEN)
        assert requests.post(f"{url}/api/v2/tickets.json", json=ticket_body(), timeout=5).status_code == 401
        assert create(server, key="k-1", external_id="proc").status_code == 201
    finally:
        stop_process(process)

    process, url = start_process(command)
    try:
        listed = requests.get(f"{url}/api/v2/tickets.json", params={"external_id": "proc"}, auth=AUTH, timeout=5)
        assert listed.json()["count"] == 1
    finally:
        stop_process(process)


# --- The package, the plugin's desk and its request hook ------------------------------


def test_the_fakedesk_package_needs_only_the_standard_library():
    # -S: no site hooks (the editable install's finder); the repository is the working directory.
    code = (
        "import sys; before = set(sys.modules); "
        "import fakedesk, fakedesk.client, fakedesk.cli, fakedesk.__main__; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
        "- set(sys.stdlib_module_names) - {'fakedesk'}))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_only_the_management_commands_import_fakedesk_from_the_product():
    # FakeDesk serves `manage.py fakedesk` and the drills (`manage.py drill`, which refuses any
    # destination but a FakeDesk it started): nothing on the path of real mail depends on it.
    importers = []
    for app in ("config", "intake", "ticketing", "reconciliation"):
        for path in sorted((REPO / app).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [alias.name for alias in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                if any(name == "fakedesk" or name.startswith("fakedesk.") for name in names):
                    importers.append(str(path.relative_to(REPO)))
    allowed = {"ticketing/management/commands/fakedesk.py", "reconciliation/management/commands/drill.py"}
    assert set(importers) <= allowed and "ticketing/management/commands/fakedesk.py" in importers
    assert not [path for path in importers if path.startswith("ticketing/") and not path.endswith("fakedesk.py")]


def test_a_request_hook_sees_every_api_request_and_may_answer_instead(desk):
    seen = []
    remove = desk.on_request(
        lambda request: seen.append((request.method, request.path, request.headers.get("Idempotency-Key")))
    )
    create(desk, key="k-1")
    requests.get(f"{desk.url}/api/v2/tickets/1.json", auth=AUTH, timeout=5)
    desk.tickets()  # the control API is not an API request
    assert seen == [("POST", "/api/v2/tickets.json", "k-1"), ("GET", "/api/v2/tickets/1.json", None)]
    remove()

    desk.on_request(
        lambda request: (503, {"error": "Hooked"}, {"Retry-After": "9"}) if request.method == "POST" else None
    )
    desk.set_plan(["error_500"])
    answer = create(desk, key="k-2")
    assert (answer.status_code, answer.json(), answer.headers["Retry-After"]) == (503, {"error": "Hooked"}, "9")
    # Intercepted: nothing written, no fault used, nothing in the request log; the removed hook saw nothing.
    assert len(desk.tickets()) == 1 and len(desk.requests_log()) == 1
    assert desk.plan()["faults"] == ["error_500"]
    assert len(seen) == 2


@pytest.mark.fakedesk(process=True)
def test_the_desk_fixture_can_run_fakedesk_in_its_own_process(desk):
    assert not desk.in_process
    with pytest.raises(RuntimeError):
        desk.on_request(lambda request: None)
    desk.set_plan(["error_500"])
    assert create(desk, key="k-1").status_code == 500
    assert create(desk, key="k-1").status_code == 201
    assert [(r["fault"], r["status"]) for r in desk.requests_log()] == [("error_500", 500), ("ok", 201)]
    assert "fault=error_500" in desk.tail()
    desk.stop()
    assert not desk.is_up()


# --- Dialects: the other APIs over the same store, plan and controls ---------------------


def test_an_unknown_dialect_is_refused_before_a_port_is_bound():
    from fakedesk import FakeDesk

    with pytest.raises(ValueError, match="unknown dialect 'remedy'"):
        FakeDesk(dialect="remedy")


def test_every_dialect_answers_on_its_own_routes_and_404s_the_zendesk_ones(desk_factory):
    from fakedesk.dialects import DIALECTS

    for name in DIALECTS:
        other = desk_factory(dialect=name, token=None)
        zendesk_route = requests.get(f"{other.url}/api/v2/tickets.json", auth=AUTH, timeout=5)
        assert (zendesk_route.status_code == 200) is (name == "zendesk"), name
        assert other.plan() == {"faults": [], "random": None}  # the control API is the same everywhere


@pytest.mark.fakedesk(dialect="jira_sm", token=None)
def test_the_search_lag_is_set_through_the_control_api_and_hides_new_records(desk):
    assert desk.set_search_lag(0.6) == {"search_lag_seconds": 0.6}
    created = requests.post(
        f"{desk.url}/rest/servicedeskapi/request",
        timeout=5,
        json={
            "serviceDeskId": "1",
            "requestTypeId": "10",
            "requestFieldValues": {"summary": "VPN down", "description": "Since 9:00", "labels": ["mailroom-lag-1"]},
        },
    )
    assert created.status_code == 201

    def found():
        answer = requests.get(
            f"{desk.url}/rest/api/3/search/jql", params={"jql": 'labels = "mailroom-lag-1"'}, timeout=5
        )
        return [issue["key"] for issue in answer.json()["issues"]]

    assert found() == []  # written, not yet indexed
    desk.advance_clock(0.7)
    assert found() == [created.json()["issueKey"]]
    with pytest.raises(ControlError):
        desk.control("search_lag", {"search_lag_seconds": -1})


def test_the_clock_moves_forward_only_and_reset_sets_it_back(desk):
    assert desk.control("clock") == {"offset_seconds": 0.0}
    assert desk.advance_clock(2) == 2.0 and desk.advance_clock(0.5) == 2.5
    with pytest.raises(ControlError):
        desk.control("clock", {"advance_seconds": -1})  # never back: a record must not become unseen again
    with pytest.raises(ControlError):
        desk.control("clock", {"advance_seconds": "soon"})
    desk.reset()
    assert desk.control("clock") == {"offset_seconds": 0.0}


def test_the_command_line_takes_a_dialect_and_a_search_lag():
    process, url = start_process(
        [sys.executable, "-m", "fakedesk", "--port", "0", "--dialect", "servicenow", "--search-lag", "2.5"]
    )
    try:
        server = DeskClient(url)
        assert server.control("search_lag") == {"search_lag_seconds": 2.5}
        answer = requests.get(f"{url}/api/now/table/incident", params={"sysparm_limit": "1"}, timeout=5)
        assert answer.status_code == 200 and answer.json() == {"result": []}
    finally:
        stop_process(process)
