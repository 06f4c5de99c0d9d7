"""ServiceNow records over the shared store: which tables exist, encoded queries, numbers and sys_ids.

A record is a store ticket whose `fields` hold the record as the Table API shows it (what was sent,
plus `sys_id`, `number`, `sys_class_name`, `sys_created_on`, `sys_updated_on`).
"""
import re
import time
import uuid

# Tables every instance has; names starting "u_" (custom) or "x_" (scoped apps) exist too.
STANDARD_TABLES = {"incident", "problem", "change_request", "sc_request", "sc_req_item", "sc_task", "task",
                   "sn_customerservice_case", "sys_user", "sys_user_group"}
NUMBER_PREFIXES = {"incident": "INC", "problem": "PRB", "change_request": "CHG", "sc_request": "REQ",
                   "sc_req_item": "RITM", "sc_task": "SCTASK", "sn_customerservice_case": "CS"}
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
    return {**record, "sys_id": uuid.uuid4().hex, "number": f"{NUMBER_PREFIXES.get(table, 'TASK')}{10001 + count:07d}",
            "sys_class_name": table, "sys_created_on": stamp, "sys_updated_on": stamp}


def store_ticket(record: dict) -> dict:
    """The store's own view of a record: subject, description, requester, our reference."""
    ticket = {"subject": str(record.get("short_description") or ""), "description": record.get("description") or "",
              "external_id": record.get("correlation_id") or None}
    caller = str(record.get("caller_id") or "")
    if "@" in caller:
        ticket["requester"] = {"email": caller}
    return ticket


def records(store, base_url: str, table: str) -> list[dict]:
    """(store id, fields) of every record of `table`, oldest first."""
    return [(t["id"], t["fields"]) for t in store.tickets(base_url) if t["fields"].get("sys_class_name") == table]


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
            order.append((part[len("ORDERBYDESC"):], True))
        elif part.startswith("ORDERBY"):
            order.append((part[len("ORDERBY"):], False))
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
    found = found[start:start + count]
    names = [name.strip() for name in fields.split(",") if name.strip()]
    return [{name: row.get(name, "") for name in names} if names else row for row in found]
