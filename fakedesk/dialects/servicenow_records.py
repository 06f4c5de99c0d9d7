"""ServiceNow records over the shared store: which tables exist, encoded queries, numbers and sys_ids.

A record is a store ticket whose `fields` hold the record as the Table API shows it (what was sent,
plus `sys_id`, `number`, `sys_class_name`, `sys_created_on`, `sys_updated_on`, and `state` "1" and
`active` "true" unless sent). A store ticket closed through the control API shows `state` "7" (Closed)
and `active` "false". Users (`sys_user`) are the store's people; watermarks (`sys_watermark`) and
attachments (`sys_attachment`) are derived from the records and the store's attachments, their sys_ids
from the store's ids, so that they are the same on every read.
"""

import hashlib
import re
import time
import uuid

# Tables every instance has; names starting "u_" (custom) or "x_" (scoped apps) exist too.
STANDARD_TABLES = {
    "incident",
    "problem",
    "change_request",
    "sc_request",
    "sc_req_item",
    "sc_task",
    "task",
    "sn_customerservice_case",
    "sys_user",
    "sys_user_group",
    "sys_watermark",
}
# Tables whose rows are not store tickets (their reads are answered from the store's other tables).
DERIVED_TABLES = {"sys_user", "sys_watermark"}
CLOSED, CANCELED = "7", "8"  # incident states that make a record inactive
NUMBER_PREFIXES = {
    "incident": "INC",
    "problem": "PRB",
    "change_request": "CHG",
    "sc_request": "REQ",
    "sc_req_item": "RITM",
    "sc_task": "SCTASK",
    "sn_customerservice_case": "CS",
}
CONDITION = re.compile(r"([a-z0-9_.]+?)(STARTSWITH|>=|<=|!=|=|IN)(.*)", re.S)
DEFAULT_LIMIT = 10000


def table_exists(name: str) -> bool:
    return name in STANDARD_TABLES or name.startswith(("u_", "x_"))


def invalid_table(name: str) -> tuple[int, dict]:
    return 400, failure(f"Invalid table {name}", None)


def failure(message: str, detail) -> dict:
    """ServiceNow's error body."""
    return {"error": {"message": message, "detail": detail}, "status": "failure"}


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def new_record(store, base_url: str, table: str, record: dict) -> dict:
    """The Table API fields of a new record of `table` (its number counts the table's records)."""
    count = sum(1 for t in store.tickets(base_url) if t["fields"].get("sys_class_name") == table)
    stamp = now()
    fields = {
        "state": "1",
        **record,
        "sys_id": uuid.uuid4().hex,
        "number": f"{NUMBER_PREFIXES.get(table, 'TASK')}{10001 + count:07d}",
        "sys_class_name": table,
        "sys_created_on": stamp,
        "sys_updated_on": stamp,
    }
    fields["active"] = active_for(fields)
    return fields


def active_for(fields: dict) -> str:
    """A task is inactive once Closed or Canceled (Resolved stays active)."""
    return "false" if str(fields.get("state")) in (CLOSED, CANCELED) else "true"


def store_ticket(record: dict, store=None) -> dict:
    """The store's own view of a record: subject, description, requester, our reference."""
    ticket = {
        "subject": str(record.get("short_description") or ""),
        "description": record.get("description") or "",
        "external_id": record.get("correlation_id") or None,
    }
    caller = person_address(store, str(record.get("caller_id") or ""))
    if caller:
        ticket["requester"] = {"email": caller}
    return ticket


def person_address(store, value: str) -> str:
    """The address a reference to a user (a sys_user's sys_id, or an address as the display value) names."""
    value = value.strip()
    if "@" in value:
        return value
    if store is not None and value:
        return next((p["email"] for p in store.people() if user_sys_id(p) == value), "")
    return ""


def record_people(store, ticket_id: int, fields: dict) -> None:
    """Who is on a record (caller_id, watch_list), kept in the store's view as requester and CCs."""
    caller = person_address(store, str(fields.get("caller_id") or ""))
    if caller:
        store.add_ticket_person(ticket_id, caller, "requester")
    for item in str(fields.get("watch_list") or "").split(","):
        watcher = person_address(store, item)
        if watcher:
            store.add_ticket_person(ticket_id, watcher, "cc")


def view(ticket: dict) -> dict:
    """A store ticket's Table API fields, closed through the control API or not."""
    fields = ticket["fields"]
    if ticket.get("status") == "closed" and fields.get("active") != "false":
        fields = {**fields, "state": CLOSED, "active": "false"}
    return fields


def records(store, base_url: str, table: str) -> list[dict]:
    """(store id, fields) of every record of `table`, oldest first."""
    return [(t["id"], view(t)) for t in store.tickets(base_url) if t["fields"].get("sys_class_name") == table]


def user_sys_id(person: dict) -> str:
    return hashlib.md5(f"sys_user:{person['id']}".encode()).hexdigest()


def user_row(person: dict) -> dict:
    """A store person as a sys_user record."""
    first, _, last = person["name"].rpartition(" ")
    return {
        "sys_id": user_sys_id(person),
        "user_name": person["email"],
        "email": person["email"],
        "name": person["name"],
        "first_name": first,
        "last_name": last or person["name"],
        "active": "true",
        "sys_created_on": person["created_at"].replace("T", " ").rstrip("Z"),
    }


def watermark(store_id: int, sys_id: str) -> str:
    """The watermark of a record's notifications ("MSG" and a number, "_" and a random-looking part)."""
    return f"MSG{10000 + store_id:07d}_{hashlib.sha256(sys_id.encode()).hexdigest()[:20]}"


def watermark_rows(store, base_url: str) -> list[dict]:
    rows = []
    for ticket in store.tickets(base_url):
        fields = ticket["fields"]
        if fields.get("sys_id"):
            mark = watermark(ticket["id"], fields["sys_id"])
            rows.append(
                {
                    "sys_id": hashlib.md5(mark.encode()).hexdigest(),
                    "number": mark.split("_")[0],
                    "source_table": fields.get("sys_class_name", ""),
                    "source_id": fields["sys_id"],
                }
            )
    return rows


def attachment_sys_id(attachment: dict) -> str:
    return hashlib.md5(f"sys_attachment:{attachment['id']}".encode()).hexdigest()


def attachment_row(base_url: str, attachment: dict, table: str, table_sys_id: str) -> dict:
    """A store attachment as the Attachment API shows its metadata (sizes as strings, the SHA-256 hash)."""
    sys_id = attachment_sys_id(attachment)
    stamp = attachment["created_at"].replace("T", " ").rstrip("Z")
    return {
        "sys_id": sys_id,
        "file_name": attachment["filename"],
        "content_type": attachment["content_type"],
        "size_bytes": str(attachment["size"]),
        "size_compressed": str(attachment["size"]),
        "hash": attachment["sha256"],
        "table_name": table,
        "table_sys_id": table_sys_id,
        "state": "available",
        "download_link": f"{base_url}/api/now/attachment/{sys_id}/file",
        "sys_created_on": stamp,
        "sys_updated_on": stamp,
        "sys_created_by": "mailroom.integration",
        "compressed": "false",
    }


def find(store, base_url: str, table: str, sys_id: str):
    """(store id, fields) of one record, or None."""
    return next(((i, f) for i, f in records(store, base_url, table) if f.get("sys_id") == sys_id), None)


def parse_query(query: str):
    """An encoded query -> ([(field, operator, value)], [(field, descending)]). "^^" is a literal caret;
    conditions this fake does not know (^OR, ^NQ, ...) are ignored."""
    conditions, order = [], []
    for part in query.replace("^^", "\0").split("^"):
        part = part.replace("\0", "^")
        if part.startswith("ORDERBYDESC"):
            order.append((part[len("ORDERBYDESC") :], True))
        elif part.startswith("ORDERBY"):
            order.append((part[len("ORDERBY") :], False))
        elif (match := CONDITION.fullmatch(part)) is not None:
            conditions.append(match.groups())
    return conditions, order


def _holds(fields: dict, field: str, operator: str, value: str) -> bool:
    actual = str(fields.get(field) or "")
    if operator == "=":
        return actual == value
    if operator == "!=":
        return actual != value
    if operator == "STARTSWITH":
        return actual.startswith(value)
    if operator == "IN":
        return actual in value.split(",")
    if operator == ">=":
        return actual >= value
    return actual <= value


def query(rows: list[dict], encoded: str, fields: str, limit: str, offset: str) -> list[dict]:
    """The Table API's answer to a GET with sysparm_query / sysparm_fields / sysparm_limit / sysparm_offset."""
    conditions, order = parse_query(encoded)
    found = [row for row in rows if all(_holds(row, *condition) for condition in conditions)]
    for field, descending in reversed(order):
        found.sort(key=lambda row, name=field: str(row.get(name) or ""), reverse=descending)
    start = int(offset) if offset.isdigit() else 0
    count = int(limit) if limit.isdigit() else DEFAULT_LIMIT
    found = found[start : start + count]
    names = [name.strip() for name in fields.split(",") if name.strip()]
    return [{name: row.get(name, "") for name in names} if names else row for row in found]
