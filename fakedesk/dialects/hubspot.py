"""FakeDesk speaking the subset of the HubSpot CRM API Mailroom's `hubspot` adapter uses.

    POST /crm/v3/objects/tickets/batch/upsert  {"inputs": [{"idProperty", "id", "properties"}]}  (a ticket write)
         -> 200 {"status": "COMPLETE", "results": [{"id", "properties", "new": true|false, ...}], ...};
            400 VALIDATION_ERROR (unknown property, bad priority, an idProperty without unique values)
    GET  /crm/v3/objects/tickets/<id>[?idProperty=<unique property>]          -> 200 the ticket, 404
    POST /crm/v3/objects/notes  {"properties": {hs_note_body, hs_timestamp}, "associations": [...]}  (a ticket write)
         -> 201 the note; 400 VALIDATION_ERROR, subCategory crm.associations.INVALID_OBJECT_IDS for no such ticket
    GET  /crm/v3/properties/tickets/<name>                                     -> 200 {"name", "hasUniqueValue"...}, 404
    GET  /crm/v3/objects/contacts?limit=N                                      -> 200 {"results", "paging"?}
    POST /crm/v3/objects/contacts/search  (filter email EQ)                    -> 200 {"total", "results"}
    POST /crm/v3/objects/contacts/batch/upsert  (idProperty email)             -> 200 {"status", "results"}
    PUT  /crm/v4/objects/tickets/<id>/associations/default/contacts/<contact id>  -> 200 {"status", "results"}
    POST /_control/hubspot/contacts  {"email", "firstname"?}: seed a contact -> {"id"}

Auth: `Authorization: Bearer <desk token>` (a private app token); anything else is 401 INVALID_AUTHENTICATION.
Tickets live in the shared store (`fields`: the properties as received, plus `associations.contacts`, a list
of {"id", "email"}); a
note is a store comment (not public: notes are internal). Only ticket upserts and notes go through the
fault plan and the request log; contacts and associations do not. Known ticket properties: PROPERTIES
(`mailroom_ref` is the one with unique values). HubSpot's search lags; the contact search here does not.
"""
import re
import time
import uuid

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler
from ..store import ValidationFailed

# Ticket properties this portal has: name -> (type, unique values).
PROPERTIES = {
    "subject": ("string", False), "content": ("string", False), "source_type": ("enumeration", False),
    "hs_pipeline": ("enumeration", False), "hs_pipeline_stage": ("enumeration", False),
    "hs_ticket_priority": ("enumeration", False), "hubspot_owner_id": ("enumeration", False),
    "hs_ticket_category": ("enumeration", False), "mailroom_ref": ("string", True),
    "mailroom_requester": ("string", False),
}
PRIORITIES = ("LOW", "MEDIUM", "HIGH", "URGENT")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def hubspot_error(category: str, message: str, **extra) -> dict:
    return {"status": "error", "message": message, "correlationId": str(uuid.uuid4()), "category": category, **extra}


class HubSpotHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/crm/v3/objects/tickets/batch/upsert"), "hs_upsert_tickets", True),
        ("GET", re.compile(r"/crm/v3/objects/tickets/([^/]+)"), "hs_get_ticket", True),
        ("POST", re.compile(r"/crm/v3/objects/notes"), "hs_create_note", True),
        ("GET", re.compile(r"/crm/v3/properties/tickets/([^/]+)"), "hs_ticket_property", True),
        ("GET", re.compile(r"/crm/v3/objects/contacts"), "hs_list_contacts", True),
        ("POST", re.compile(r"/crm/v3/objects/contacts/search"), "hs_search_contacts", True),
        ("POST", re.compile(r"/crm/v3/objects/contacts/batch/upsert"), "hs_upsert_contacts", True),
        ("PUT", re.compile(r"/crm/v4/objects/tickets/(\d+)/associations/default/contacts/(\d+)"),
         "hs_associate_contact", True),
    ]
    CONTROL_ROUTES = Handler.CONTROL_ROUTES + [
        ("POST", re.compile(r"/_control/hubspot/contacts"), "control_seed_contact", False),
    ]
    IDEMPOTENCY_HEADER = None
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (401, hubspot_error("INVALID_AUTHENTICATION", "Authentication credentials not found. "
                                          "This API supports OAuth 2.0 authentication and you can find more details "
                                          "at https://developers.hubspot.com/docs/methods/auth/oauth-overview"))

    def _authenticated(self) -> bool:
        token = self.desk.token
        if not token:
            return True
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and value.strip() == token

    def rejection(self, fault):
        answer = rejection_for(fault)
        if answer is None:
            return None
        status, headers, _ = answer
        if status == 429:
            return 429, headers, {**hubspot_error("RATE_LIMITS", "You have reached your ten_secondly_rolling "
                                                  "limit."), "errorType": "RATE_LIMIT",
                                  "policyName": "TEN_SECONDLY_ROLLING"}
        if status == 401:
            return 401, headers, self.UNAUTHENTICATED[1]
        if status == 422:
            return 400, headers, hubspot_error("VALIDATION_ERROR", "Property values were not valid: "
                                               '[{"isValid":false,"message":"not a valid email","name":"email"}]')
        return status, headers, hubspot_error("INTERNAL_ERROR", "internal error")

    def invalid_body(self) -> tuple[int, dict]:
        return 400, hubspot_error("VALIDATION_ERROR", "Invalid input JSON on line 1")

    # Tickets.

    def _ticket_json(self, ticket: dict, new: bool | None = None) -> dict:
        properties = {k: v for k, v in ticket["fields"].items() if k != "associations"}
        properties.update({"hs_object_id": str(ticket["id"]), "createdate": ticket["created_at"],
                           "hs_lastmodifieddate": ticket["updated_at"]})
        body = {"id": str(ticket["id"]), "properties": properties, "createdAt": ticket["created_at"],
                "updatedAt": ticket["updated_at"], "archived": False}
        if new is not None:
            body["new"] = new
        return body

    def _property_errors(self, properties: dict) -> list[dict]:
        errors = [{"isValid": False, "message": f'Property "{name}" does not exist', "error": "PROPERTY_DOESNT_EXIST",
                   "name": name} for name in properties if name not in PROPERTIES]
        priority = properties.get("hs_ticket_priority")
        if priority is not None and priority not in PRIORITIES:
            errors.append({"isValid": False, "message": f"{priority} was not one of the allowed options",
                           "error": "INVALID_OPTION", "name": "hs_ticket_priority"})
        return errors

    def hs_upsert_tickets(self):
        def first_ref(body):
            inputs = body.get("inputs") if isinstance(body.get("inputs"), list) else []
            return inputs[0].get("id") if inputs and isinstance(inputs[0], dict) else None
        self._ticket_write("POST", "/crm/v3/objects/tickets/batch/upsert", self._do_upsert, external_id_of=first_ref)

    def _do_upsert(self, body: dict) -> WriteOutcome:
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or not inputs or not all(isinstance(i, dict) for i in inputs):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "inputs must be a non-empty list"))
        for item in inputs:
            id_property, properties = item.get("idProperty"), item.get("properties")
            if not PROPERTIES.get(id_property, (None, False))[1]:
                return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", f"{id_property} is not a property "
                                                       "with unique values; it cannot be an idProperty"))
            if not isinstance(properties, dict) or not item.get("id"):
                return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "each input needs id and properties"))
            errors = self._property_errors(properties)
            if errors:
                return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", f"Property values were not valid: "
                                                       f"{errors}", errors=errors))
        results, base = [], self._base_url()
        for item in inputs:
            ref, properties = str(item["id"]), {**item["properties"], item["idProperty"]: str(item["id"])}
            ticket = {"subject": properties.get("subject"), "description": properties.get("content"),
                      "external_id": ref}
            existing = self.desk.store.tickets(base, ref)
            try:
                if existing:
                    store_id = existing[0]["id"]
                    self.desk.store.update_fields(store_id, ticket, properties)
                else:
                    store_id = self.desk.store.create_ticket(ticket, fields=properties)
            except ValidationFailed as exc:
                return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "Property values were not valid",
                                                       errors=[{"name": "content" if k == "description" else k,
                                                                "error": "INVALID_VALUE"} for k in exc.details]))
            results.append(self._ticket_json(self.desk.store.ticket(store_id, base), new=not existing))
        return WriteOutcome(200, {"status": "COMPLETE", "results": results, "startedAt": _now(),
                                  "completedAt": _now()}, committed=True, ticket_id=int(results[0]["id"]))

    def hs_get_ticket(self, ticket_id):
        id_property = (self.query.get("idProperty") or [None])[0]
        with self.desk.store.transaction():
            if id_property:
                found = self.desk.store.tickets(self._base_url(), ticket_id) if PROPERTIES.get(
                    id_property, (None, False))[1] else []
                ticket = found[0] if found else None
            else:
                ticket = self.desk.store.ticket(int(ticket_id), self._base_url()) if ticket_id.isdigit() else None
        if ticket is None:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", "Object not found.  objectId are usually numeric.",
                                          context={"id": [ticket_id]}))
        else:
            self._send(200, self._ticket_json(ticket))

    def hs_ticket_property(self, name):
        if name not in PROPERTIES:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", f"Unable to find property {name} for object "
                                          "type ticket"))
            return
        kind, unique = PROPERTIES[name]
        self._send(200, {"name": name, "label": name.replace("_", " ").title(), "type": kind,
                         "fieldType": "text" if kind == "string" else "select", "groupName": "ticketinformation",
                         "hasUniqueValue": unique, "hidden": False, "formField": False,
                         "modificationMetadata": {"archivable": True, "readOnlyDefinition": False,
                                                  "readOnlyValue": False}})

    # Notes.

    def hs_create_note(self):
        self._ticket_write("POST", "/crm/v3/objects/notes", self._do_note, external_id_of=lambda note: None)

    def _do_note(self, note: dict) -> WriteOutcome:
        properties = note.get("properties") if isinstance(note.get("properties"), dict) else {}
        if not properties.get("hs_timestamp"):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_timestamp is required"))
        ticket_ids = [str((a.get("to") or {}).get("id")) for a in note.get("associations") or []
                      if isinstance(a, dict) and any(t.get("associationTypeId") == 228 for t in a.get("types") or [])]
        base = self._base_url()
        missing = [i for i in ticket_ids if not i.isdigit() or self.desk.store.ticket(int(i), base) is None]
        if not ticket_ids or missing:
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", f"One or more of the following object "
                                                   f"IDs was invalid: {missing}",
                                                   subCategory="crm.associations.INVALID_OBJECT_IDS"))
        try:
            audits = [self.desk.store.add_comment(int(i), {
                "comment": {"body": properties.get("hs_note_body"), "public": False},
                "metadata": {"hs_timestamp": properties["hs_timestamp"]}}) for i in ticket_ids]
        except ValidationFailed:
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_note_body must not be empty"))
        note_id = str(audits[0]["id"])
        return WriteOutcome(201, {"id": note_id, "properties": {**properties, "hs_object_id": note_id},
                                  "createdAt": _now(), "updatedAt": _now(), "archived": False},
                            committed=True, ticket_id=int(ticket_ids[0]))

    # Contacts and associations (not ticket writes: no faults, not in the request log).

    def _contacts(self) -> dict:
        """email (lower case) -> contact JSON, kept on the desk between requests."""
        return self.desk.__dict__.setdefault("hubspot_contacts", {})

    def _add_contact(self, email: str, firstname: str | None) -> dict:
        contacts = self._contacts()
        key = email.strip().lower()
        if key not in contacts:
            contact_id = str(100 + len(contacts) + 1)
            contacts[key] = {"id": contact_id, "properties": {"email": key, "firstname": firstname,
                                                              "hs_object_id": contact_id, "createdate": _now()},
                             "createdAt": _now(), "updatedAt": _now(), "archived": False}
        return contacts[key]

    def hs_list_contacts(self):
        limit = (self.query.get("limit") or ["10"])[0]
        with self.desk.store.transaction():
            results = list(self._contacts().values())[:int(limit) if limit.isdigit() else 10]
        self._send(200, {"results": results})

    def hs_search_contacts(self):
        body = self._json_body()
        if body is None:
            return
        wanted = [f.get("value") for g in body.get("filterGroups") or [] for f in g.get("filters") or []
                  if f.get("propertyName") == "email" and f.get("operator") == "EQ"]
        with self.desk.store.transaction():
            contacts = self._contacts()
            results = [contacts[str(v).lower()] for v in wanted if str(v).lower() in contacts]
        self._send(200, {"total": len(results), "results": results[:int(body.get("limit") or 10)]})

    def hs_upsert_contacts(self):
        body = self._json_body()
        if body is None:
            return
        inputs = [i for i in body.get("inputs") or [] if isinstance(i, dict)]
        if not inputs or any(i.get("idProperty") != "email" or "@" not in str(i.get("id")) for i in inputs):
            self._send(400, hubspot_error("VALIDATION_ERROR", "contacts upsert by email needs an email id"))
            return
        with self.desk.store.transaction():
            results = [self._add_contact(str(i["id"]), (i.get("properties") or {}).get("firstname")) for i in inputs]
        self._send(200, {"status": "COMPLETE", "results": results, "startedAt": _now(), "completedAt": _now()})

    def hs_associate_contact(self, ticket_id, contact_id):
        with self.desk.store.transaction():
            ticket = self.desk.store.ticket(int(ticket_id), self._base_url())
            contact = next((c for c in self._contacts().values() if c["id"] == contact_id), None)
            known = contact is not None
            if ticket is not None and known:
                linked = (ticket["fields"].get("associations") or {}).get("contacts") or []
                if all(link["id"] != contact_id for link in linked):
                    link = {"id": contact_id, "email": contact["properties"]["email"]}
                    self.desk.store.update_fields(int(ticket_id), {}, {"associations": {"contacts": linked + [link]}})
        if ticket is None or not known:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", "one of the objects does not exist"))
            return
        spec = {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 16}
        self._send(200, {"status": "COMPLETE", "results": [
            {"from": {"id": ticket_id}, "to": {"id": contact_id}, "associationSpec": spec}],
            "startedAt": _now(), "completedAt": _now()})

    # Control.

    def control_seed_contact(self):
        body = self._json_body()
        if body is None:
            return
        if "@" not in str(body.get("email") or ""):
            self._send(400, {"error": "BadContact", "description": "email is required"})
            return
        with self.desk.store.transaction():
            contact = self._add_contact(str(body["email"]), body.get("firstname"))
        self._send(201, {"id": contact["id"]})

    def control_reset(self):
        with self.desk.store.transaction():
            self._contacts().clear()
        super().control_reset()
