"""FakeDesk speaking the subset of the HubSpot CRM API Mailroom's `hubspot` adapter uses.

    POST /crm/v3/objects/tickets/batch/upsert  {"inputs": [{"idProperty", "id", "properties"}]}  (a ticket write)
         -> 200 {"status": "COMPLETE", "results": [{"id", "properties", "new": true|false, ...}], ...};
            400 VALIDATION_ERROR (unknown property, bad priority, an idProperty without unique values)
    GET  /crm/v3/objects/tickets/<id>[?idProperty=<unique property>]          -> 200 the ticket, 404
    POST /crm/v3/objects/notes  {"properties": {hs_note_body, hs_timestamp, hs_attachment_ids?}, "associations":
         [...]}  (a ticket write) -> 201 the note; 400 VALIDATION_ERROR, subCategory
         crm.associations.INVALID_OBJECT_IDS for no such ticket
    POST /crm/v3/objects/emails  {"properties": {hs_timestamp, hs_email_direction, hs_email_text, hs_email_headers
         (JSON: from.email ...)}, "associations": [... type 224]}  (a ticket write) -> 201 the email: a public
         store comment written as its sender
    GET  /crm/v3/properties/tickets/<name>                                     -> 200 {"name", "hasUniqueValue"...}, 404
    PATCH /crm/v3/objects/tickets/<id>  {"properties": {...}}  (a ticket write) -> 200 the ticket; a CLOSED
         stage closes it in the store, an OPEN one opens it
    GET  /crm/v3/pipelines/tickets/<pipeline id>                               -> 200 {"id", "stages": [{"id",
         "displayOrder", "metadata": {"ticketState": "OPEN"|"CLOSED"}}]}, 404
    GET  /crm/v3/objects/contacts?limit=N                                      -> 200 {"results", "paging"?}
    GET  /crm/v3/objects/contacts/<email>?idProperty=email                     -> 200 the contact, 404
    POST /crm/v3/objects/contacts/search  (filter email EQ)                    -> 200 {"total", "results"}
    POST /crm/v3/objects/contacts/batch/upsert  (idProperty email)             -> 200 {"status", "results"}
    PUT  /crm/v4/objects/tickets/<id>/associations/default/contacts/<contact id>  -> 200 {"status", "results"}
    PUT  /crm/v4/objects/tickets/<id>/associations/default/tickets/<ticket id>    -> 200 (both directions)
    GET  /crm/v4/objects/tickets/<id>/associations/notes                       -> 200 {"results": [{"toObjectId",
         "associationTypes"}]}
    POST /crm/v3/objects/notes/batch/read  {"properties", "inputs": [{"id"}]}   -> 200 {"status", "results"}
    POST /files/v3/files  multipart: file, fileName, folderPath, options (access required)  (a ticket write)
         -> 201 {"id", "name", "extension", "path", "size", "access", "parentFolderId", ...}
    GET  /files/v3/files/search?limit=N                                        -> 200 {"results"}
    POST /_control/hubspot/contacts  {"email", "firstname"?}: seed a contact -> {"id"}

Auth: `Authorization: Bearer <desk token>` (a private app token); anything else is 401 INVALID_AUTHENTICATION.
Tickets live in the shared store (`fields`: the properties as received, plus `associations.contacts`, a list
of {"id", "email"}, and `associations.tickets`, a list of {"id"}); a note is a store comment (not public:
notes are internal; its metadata keeps hs_timestamp and hs_attachment_ids). A note's hs_attachment_ids put
those uploaded files on its tickets (store attachments, marker: the file's folder name, Mailroom's file key).
A contact is a store person (id 100 + the person's); the first contact associated with a ticket is its
requester in the store, the later ones its CCs (HubSpot keeps no roles). `POST /_control/close` closes a
ticket: it reads back in its pipeline's CLOSED stage. Ticket upserts and updates, notes and file uploads go
through the fault plan and the request log; contacts, associations and reads do not. Known ticket
properties: PROPERTIES (`mailroom_ref` is the one with unique values); pipelines: PIPELINES.
HubSpot's search lags; the contact search here does not.
"""

import base64
import email.parser
import email.policy
import json
import re
import time
import uuid
from urllib.parse import unquote

from ..desk import WriteOutcome
from ..faults import rejection_for
from ..handler import Handler
from ..store import ValidationFailed

# Ticket properties this portal has: name -> (type, unique values).
PROPERTIES = {
    "subject": ("string", False),
    "content": ("string", False),
    "source_type": ("enumeration", False),
    "hs_pipeline": ("enumeration", False),
    "hs_pipeline_stage": ("enumeration", False),
    "hs_ticket_priority": ("enumeration", False),
    "hubspot_owner_id": ("enumeration", False),
    "hs_ticket_category": ("enumeration", False),
    "mailroom_ref": ("string", True),
    "mailroom_requester": ("string", False),
}
PRIORITIES = ("LOW", "MEDIUM", "HIGH", "URGENT")
# Ticket pipelines of this portal: id -> [(stage id, ticketState)] in display order. "0" is HubSpot's default
# Support Pipeline (New, Waiting on contact, Waiting on us, Closed).
PIPELINES = {
    "0": [("1", "OPEN"), ("2", "OPEN"), ("3", "OPEN"), ("4", "CLOSED")],
    "billing-pipeline": [("billing-new", "OPEN"), ("billing-closed", "CLOSED")],
    "tech-pipeline": [("tech-new", "OPEN"), ("tech-closed", "CLOSED")],
}
FILE_ACCESS = (
    "PUBLIC_INDEXABLE",
    "PUBLIC_NOT_INDEXABLE",
    "HIDDEN_INDEXABLE",
    "HIDDEN_NOT_INDEXABLE",
    "HIDDEN_PRIVATE",
    "PRIVATE",
    "HIDDEN_SENSITIVE",
    "SENSITIVE",
)


def contact_id_of(person_id: int) -> str:
    return str(100 + int(person_id))


def stage_state(pipeline: str, stage: str) -> str | None:
    return next((state for stage_id, state in PIPELINES.get(pipeline, ()) if stage_id == stage), None)


def closed_stage(pipeline: str) -> str | None:
    return next((stage_id for stage_id, state in PIPELINES.get(pipeline, ()) if state == "CLOSED"), None)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def hubspot_error(category: str, message: str, **extra) -> dict:
    return {"status": "error", "message": message, "correlationId": str(uuid.uuid4()), "category": category, **extra}


class HubSpotHandler(Handler):
    API_ROUTES = [
        ("POST", re.compile(r"/crm/v3/objects/tickets/batch/upsert"), "hs_upsert_tickets", True),
        ("GET", re.compile(r"/crm/v3/objects/tickets/([^/]+)"), "hs_get_ticket", True),
        ("POST", re.compile(r"/crm/v3/objects/notes"), "hs_create_note", True),
        ("POST", re.compile(r"/crm/v3/objects/emails"), "hs_create_email", True),
        ("GET", re.compile(r"/crm/v3/properties/tickets/([^/]+)"), "hs_ticket_property", True),
        ("PATCH", re.compile(r"/crm/v3/objects/tickets/(\d+)"), "hs_update_ticket", True),
        ("GET", re.compile(r"/crm/v3/pipelines/tickets/([^/]+)"), "hs_pipeline", True),
        ("GET", re.compile(r"/crm/v3/objects/contacts"), "hs_list_contacts", True),
        ("GET", re.compile(r"/crm/v3/objects/contacts/([^/]+)"), "hs_get_contact", True),
        ("POST", re.compile(r"/crm/v3/objects/contacts/search"), "hs_search_contacts", True),
        ("POST", re.compile(r"/crm/v3/objects/contacts/batch/upsert"), "hs_upsert_contacts", True),
        (
            "PUT",
            re.compile(r"/crm/v4/objects/tickets/(\d+)/associations/default/contacts/(\d+)"),
            "hs_associate_contact",
            True,
        ),
        (
            "PUT",
            re.compile(r"/crm/v4/objects/tickets/(\d+)/associations/default/tickets/(\d+)"),
            "hs_associate_ticket",
            True,
        ),
        ("GET", re.compile(r"/crm/v4/objects/tickets/(\d+)/associations/notes"), "hs_ticket_notes", True),
        ("POST", re.compile(r"/crm/v3/objects/notes/batch/read"), "hs_read_notes", True),
        ("POST", re.compile(r"/files/v3/files"), "hs_upload_file", True),
        ("GET", re.compile(r"/files/v3/files/search"), "hs_search_files", True),
    ]
    CONTROL_ROUTES = Handler.CONTROL_ROUTES + [
        ("POST", re.compile(r"/_control/hubspot/contacts"), "control_seed_contact", False),
    ]
    IDEMPOTENCY_HEADER = None
    PAYLOAD_KEY = None
    UNAUTHENTICATED = (
        401,
        hubspot_error(
            "INVALID_AUTHENTICATION",
            "Authentication credentials not found. "
            "This API supports OAuth 2.0 authentication and you can find more details "
            "at https://developers.hubspot.com/docs/methods/auth/oauth-overview",
        ),
    )

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
            return (
                429,
                headers,
                {
                    **hubspot_error("RATE_LIMITS", "You have reached your ten_secondly_rolling limit."),
                    "errorType": "RATE_LIMIT",
                    "policyName": "TEN_SECONDLY_ROLLING",
                },
            )
        if status == 401:
            return 401, headers, self.UNAUTHENTICATED[1]
        if status == 422:
            return (
                400,
                headers,
                hubspot_error(
                    "VALIDATION_ERROR",
                    'Property values were not valid: [{"isValid":false,"message":"not a valid email","name":"email"}]',
                ),
            )
        return status, headers, hubspot_error("INTERNAL_ERROR", "internal error")

    def invalid_body(self) -> tuple[int, dict]:
        return 400, hubspot_error("VALIDATION_ERROR", "Invalid input JSON on line 1")

    def _parse_json(self) -> dict | None:
        """A JSON body, or a multipart/form-data one (the files API) as {"fields": {...}, "file": {"filename",
        "content_type", "data": base64}}: the record a write sees either way."""
        content_type = self.headers.get("Content-Type") or ""
        if not content_type.lower().startswith("multipart/form-data"):
            return super()._parse_json()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + (self.raw_body or b"")
        )
        if not message.is_multipart():
            return None
        fields, upload = {}, None
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            data = part.get_payload(decode=True) or b""
            if part.get_filename() is not None:
                upload = {
                    "name": name,
                    "filename": part.get_filename(),
                    "content_type": part.get_content_type(),
                    "data": base64.b64encode(data).decode(),
                }
            elif name:
                fields[str(name)] = data.decode("utf-8", errors="replace")
        return {"fields": fields, "file": upload}

    # Tickets.

    def _ticket_json(self, ticket: dict, new: bool | None = None) -> dict:
        properties = {k: v for k, v in ticket["fields"].items() if k != "associations"}
        properties.update(
            {
                "hs_object_id": str(ticket["id"]),
                "createdate": ticket["created_at"],
                "hs_lastmodifieddate": ticket["updated_at"],
            }
        )
        if ticket["status"] == "closed":
            # Closed by an agent (the control API): the ticket sits in its pipeline's closed stage.
            pipeline = str(properties.get("hs_pipeline") or "0")
            properties["hs_pipeline_stage"] = closed_stage(pipeline) or properties.get("hs_pipeline_stage")
        body = {
            "id": str(ticket["id"]),
            "properties": properties,
            "createdAt": ticket["created_at"],
            "updatedAt": ticket["updated_at"],
            "archived": False,
        }
        if new is not None:
            body["new"] = new
        return body

    def _property_errors(self, properties: dict) -> list[dict]:
        errors = [
            {
                "isValid": False,
                "message": f'Property "{name}" does not exist',
                "error": "PROPERTY_DOESNT_EXIST",
                "name": name,
            }
            for name in properties
            if name not in PROPERTIES
        ]
        priority = properties.get("hs_ticket_priority")
        if priority is not None and priority not in PRIORITIES:
            errors.append(
                {
                    "isValid": False,
                    "message": f"{priority} was not one of the allowed options",
                    "error": "INVALID_OPTION",
                    "name": "hs_ticket_priority",
                }
            )
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
                return WriteOutcome(
                    400,
                    hubspot_error(
                        "VALIDATION_ERROR",
                        f"{id_property} is not a property with unique values; it cannot be an idProperty",
                    ),
                )
            if not isinstance(properties, dict) or not item.get("id"):
                return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "each input needs id and properties"))
            errors = self._property_errors(properties)
            if errors:
                return WriteOutcome(
                    400, hubspot_error("VALIDATION_ERROR", f"Property values were not valid: {errors}", errors=errors)
                )
        results, base = [], self._base_url()
        for item in inputs:
            ref, properties = str(item["id"]), {**item["properties"], item["idProperty"]: str(item["id"])}
            ticket = {
                "subject": properties.get("subject"),
                "description": properties.get("content"),
                "external_id": ref,
            }
            existing = self.desk.store.tickets(base, ref)
            try:
                if existing:
                    store_id = existing[0]["id"]
                    self.desk.store.update_fields(store_id, ticket, properties)
                else:
                    store_id = self.desk.store.create_ticket(ticket, fields=properties)
            except ValidationFailed as exc:
                return WriteOutcome(
                    400,
                    hubspot_error(
                        "VALIDATION_ERROR",
                        "Property values were not valid",
                        errors=[
                            {"name": "content" if k == "description" else k, "error": "INVALID_VALUE"}
                            for k in exc.details
                        ],
                    ),
                )
            results.append(self._ticket_json(self.desk.store.ticket(store_id, base), new=not existing))
        return WriteOutcome(
            200,
            {"status": "COMPLETE", "results": results, "startedAt": _now(), "completedAt": _now()},
            committed=True,
            ticket_id=int(results[0]["id"]),
        )

    def hs_get_ticket(self, ticket_id):
        id_property = (self.query.get("idProperty") or [None])[0]
        with self.desk.store.transaction():
            if id_property:
                found = (
                    self.desk.store.tickets(self._base_url(), ticket_id)
                    if PROPERTIES.get(id_property, (None, False))[1]
                    else []
                )
                ticket = found[0] if found else None
            else:
                ticket = self.desk.store.ticket(int(ticket_id), self._base_url()) if ticket_id.isdigit() else None
        if ticket is None:
            self._send(
                404,
                hubspot_error(
                    "OBJECT_NOT_FOUND", "Object not found.  objectId are usually numeric.", context={"id": [ticket_id]}
                ),
            )
        else:
            self._send(200, self._ticket_json(ticket))

    def hs_ticket_property(self, name):
        if name not in PROPERTIES:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", f"Unable to find property {name} for object type ticket"))
            return
        kind, unique = PROPERTIES[name]
        self._send(
            200,
            {
                "name": name,
                "label": name.replace("_", " ").title(),
                "type": kind,
                "fieldType": "text" if kind == "string" else "select",
                "groupName": "ticketinformation",
                "hasUniqueValue": unique,
                "hidden": False,
                "formField": False,
                "modificationMetadata": {"archivable": True, "readOnlyDefinition": False, "readOnlyValue": False},
            },
        )

    def hs_update_ticket(self, ticket_id):
        self._ticket_write(
            "PATCH",
            f"/crm/v3/objects/tickets/{ticket_id}",
            lambda body: self._do_update_ticket(int(ticket_id), body),
            external_id_of=lambda b: None,
        )

    def _do_update_ticket(self, ticket_id: int, body: dict) -> WriteOutcome:
        base, properties = self._base_url(), body.get("properties")
        ticket = self.desk.store.ticket(ticket_id, base)
        if ticket is None:
            return WriteOutcome(404, hubspot_error("OBJECT_NOT_FOUND", "Object not found."))
        if not isinstance(properties, dict):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "properties must be an object"))
        errors = self._property_errors(properties)
        pipeline = str(properties.get("hs_pipeline") or ticket["fields"].get("hs_pipeline") or "0")
        stage = properties.get("hs_pipeline_stage")
        if stage is not None and stage_state(pipeline, str(stage)) is None:
            errors.append(
                {
                    "isValid": False,
                    "message": f"{stage} is not a stage of pipeline {pipeline}",
                    "error": "INVALID_OPTION",
                    "name": "hs_pipeline_stage",
                }
            )
        if errors:
            return WriteOutcome(
                400, hubspot_error("VALIDATION_ERROR", f"Property values were not valid: {errors}", errors=errors)
            )
        self.desk.store.update_fields(ticket_id, {}, properties)
        if stage is not None:
            self.desk.store.set_status(ticket_id, "closed" if stage_state(pipeline, str(stage)) == "CLOSED" else "open")
        return WriteOutcome(
            200, self._ticket_json(self.desk.store.ticket(ticket_id, base)), committed=True, ticket_id=ticket_id
        )

    def hs_pipeline(self, pipeline_id):
        stages = PIPELINES.get(pipeline_id)
        if stages is None:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", f"Unable to find pipeline {pipeline_id}"))
            return
        self._send(
            200,
            {
                "id": pipeline_id,
                "label": pipeline_id,
                "displayOrder": 0,
                "archived": False,
                "createdAt": _now(),
                "updatedAt": _now(),
                "stages": [
                    {
                        "id": stage_id,
                        "label": stage_id,
                        "displayOrder": order,
                        "archived": False,
                        "metadata": {"ticketState": state},
                        "createdAt": _now(),
                        "updatedAt": _now(),
                    }
                    for order, (stage_id, state) in enumerate(stages)
                ],
            },
        )

    # Notes.

    def hs_create_note(self):
        self._ticket_write("POST", "/crm/v3/objects/notes", self._do_note, external_id_of=lambda note: None)

    def _do_note(self, note: dict) -> WriteOutcome:
        properties = note.get("properties") if isinstance(note.get("properties"), dict) else {}
        if not properties.get("hs_timestamp"):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_timestamp is required"))
        ticket_ids = [
            str((a.get("to") or {}).get("id"))
            for a in note.get("associations") or []
            if isinstance(a, dict) and any(t.get("associationTypeId") == 228 for t in a.get("types") or [])
        ]
        base = self._base_url()
        missing = [i for i in ticket_ids if not i.isdigit() or self.desk.store.ticket(int(i), base) is None]
        if not ticket_ids or missing:
            return WriteOutcome(
                400,
                hubspot_error(
                    "VALIDATION_ERROR",
                    f"One or more of the following object IDs was invalid: {missing}",
                    subCategory="crm.associations.INVALID_OBJECT_IDS",
                ),
            )
        attachment_ids = [a for a in str(properties.get("hs_attachment_ids") or "").split(";") if a]
        uploads = [self.desk.store.upload(a) for a in attachment_ids]
        if any(upload is None for upload in uploads):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_attachment_ids: no such file"))
        body = properties.get("hs_note_body")
        if not uploads and (not isinstance(body, str) or not body.strip()):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_note_body must not be empty"))
        metadata = {
            "note": True,
            "hs_timestamp": properties["hs_timestamp"],
            "hs_attachment_ids": ";".join(attachment_ids),
        }
        note_ids = []
        for ticket_id in ticket_ids:
            note_ids.append(
                self.desk.store.insert_comment(int(ticket_id), str(body or ""), public=False, metadata=metadata)
            )
            for upload in uploads:
                self.desk.store.add_attachment(
                    int(ticket_id),
                    filename=upload["filename"],
                    content_type=upload["content_type"],
                    size=upload["size"],
                    sha256=upload["sha256"],
                    comment_id=note_ids[-1],
                    marker=self._files().get(upload["token"], {}).get("folder", "").rsplit("/", 1)[-1],
                )
        note_id = str(note_ids[0])
        return WriteOutcome(
            201,
            {
                "id": note_id,
                "properties": {**properties, "hs_object_id": note_id},
                "createdAt": _now(),
                "updatedAt": _now(),
                "archived": False,
            },
            committed=True,
            ticket_id=int(ticket_ids[0]),
        )

    def hs_create_email(self):
        self._ticket_write("POST", "/crm/v3/objects/emails", self._do_email, external_id_of=lambda email: None)

    def _do_email(self, email: dict) -> WriteOutcome:
        properties = email.get("properties") if isinstance(email.get("properties"), dict) else {}
        if not properties.get("hs_timestamp"):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_timestamp is required"))
        direction = properties.get("hs_email_direction")
        if direction not in ("EMAIL", "INCOMING_EMAIL", "FORWARDED_EMAIL"):
            return WriteOutcome(
                400,
                hubspot_error(
                    "VALIDATION_ERROR", f"{direction} was not one of the allowed options for hs_email_direction"
                ),
            )
        try:
            headers = json.loads(properties.get("hs_email_headers") or "{}")
        except ValueError:
            headers = None
        if not isinstance(headers, dict):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "hs_email_headers must be a JSON object"))
        ticket_ids = [
            str((a.get("to") or {}).get("id"))
            for a in email.get("associations") or []
            if isinstance(a, dict) and any(t.get("associationTypeId") == 224 for t in a.get("types") or [])
        ]
        base = self._base_url()
        missing = [i for i in ticket_ids if not i.isdigit() or self.desk.store.ticket(int(i), base) is None]
        if not ticket_ids or missing:
            return WriteOutcome(
                400,
                hubspot_error(
                    "VALIDATION_ERROR",
                    f"One or more of the following object IDs was invalid: {missing}",
                    subCategory="crm.associations.INVALID_OBJECT_IDS",
                ),
            )
        sender = str((headers.get("from") or {}).get("email") or "")
        metadata = {"email": True, "hs_timestamp": properties["hs_timestamp"], "hs_email_direction": direction}
        email_ids = [
            self.desk.store.insert_comment(
                int(i),
                str(properties.get("hs_email_text") or ""),
                public=True,
                author=sender.lower(),
                metadata=metadata,
            )
            for i in ticket_ids
        ]
        email_id = str(email_ids[0])
        return WriteOutcome(
            201,
            {
                "id": email_id,
                "properties": {**properties, "hs_object_id": email_id, "hs_email_from_email": sender},
                "createdAt": _now(),
                "updatedAt": _now(),
                "archived": False,
            },
            committed=True,
            ticket_id=int(ticket_ids[0]),
        )

    def hs_ticket_notes(self, ticket_id):
        with self.desk.store.transaction():
            exists = self.desk.store.ticket(int(ticket_id), self._base_url()) is not None
            notes = [c for c in self.desk.store.comments(int(ticket_id)) if c["metadata"]["custom"].get("note")]
        if not exists:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", "Object not found."))
            return
        spec = [{"category": "HUBSPOT_DEFINED", "typeId": 227, "label": None}]  # ticket -> note
        self._send(200, {"results": [{"toObjectId": int(n["id"]), "associationTypes": spec} for n in notes]})

    def hs_read_notes(self):
        body = self._json_body()
        if body is None:
            return
        wanted = {str(i.get("id")) for i in body.get("inputs") or [] if isinstance(i, dict)}
        if len(wanted) > 100:
            self._send(400, hubspot_error("VALIDATION_ERROR", "at most 100 inputs"))
            return
        results = []
        with self.desk.store.transaction():
            for ticket in self.desk.store.tickets(self._base_url()):
                for note in self.desk.store.comments(ticket["id"]):
                    custom = note["metadata"]["custom"]
                    if custom.get("note") and str(note["id"]) in wanted:
                        properties = {
                            "hs_object_id": str(note["id"]),
                            "hs_note_body": note["body"],
                            "hs_timestamp": custom.get("hs_timestamp"),
                            "hs_attachment_ids": custom.get("hs_attachment_ids") or None,
                        }
                        results.append(
                            {
                                "id": str(note["id"]),
                                "properties": properties,
                                "archived": False,
                                "createdAt": note["created_at"],
                                "updatedAt": note["created_at"],
                            }
                        )
        self._send(200, {"status": "COMPLETE", "results": results, "startedAt": _now(), "completedAt": _now()})

    # Files.

    def _files(self) -> dict:
        """file id -> {"folder", "name", "access"}: what the file manager knows beside the store's upload."""
        return self.desk.__dict__.setdefault("hubspot_files", {})

    def hs_upload_file(self):
        self._ticket_write("POST", "/files/v3/files", self._do_upload, external_id_of=lambda body: None)

    def _do_upload(self, body: dict) -> WriteOutcome:
        fields, upload = body.get("fields"), body.get("file")
        if not isinstance(fields, dict) or not isinstance(upload, dict) or upload.get("name") != "file":
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "a multipart body with a file part is required"))
        try:
            options = json.loads(fields.get("options") or "null")
        except ValueError:
            options = None
        if not isinstance(options, dict) or options.get("access") not in FILE_ACCESS:
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "options.access is required"))
        folder = fields.get("folderPath")
        if bool(folder) == bool(fields.get("folderId")):
            return WriteOutcome(400, hubspot_error("VALIDATION_ERROR", "either folderId or folderPath is required"))
        files, folders = self._files(), self.desk.__dict__.setdefault("hubspot_folders", {})
        file_id = str(900000 + len(files) + 1)
        folder_id = folders.setdefault(str(folder), str(800000 + len(folders) + 1))
        filename = fields.get("fileName") or upload["filename"]
        data = base64.b64decode(upload["data"])
        self.desk.store.add_upload(file_id, filename, upload["content_type"], data)
        name, _, extension = filename.rpartition(".") if "." in filename else (filename, "", "")
        files[file_id] = {"folder": str(folder or ""), "name": name, "access": options["access"]}
        return WriteOutcome(
            201,
            {
                "id": file_id,
                "name": name,
                "extension": extension,
                "size": len(data),
                "path": f"{folder}/{filename}",
                "access": options["access"],
                "parentFolderId": folder_id,
                "archived": False,
                "isUsableInContent": True,
                "type": "OTHER",
                "createdAt": _now(),
                "updatedAt": _now(),
            },
            committed=True,
        )

    def hs_search_files(self):
        with self.desk.store.transaction():
            results = [
                {"id": file_id, "name": meta["name"], "path": meta["folder"], "access": meta["access"]}
                for file_id, meta in self._files().items()
            ]
        limit = (self.query.get("limit") or ["10"])[0]
        self._send(200, {"results": results[: int(limit) if limit.isdigit() else 10]})

    # Contacts and associations (not ticket writes: no faults, not in the request log). A contact is a person.

    def _contact_json(self, person: dict) -> dict:
        contact_id = contact_id_of(person["id"])
        return {
            "id": contact_id,
            "properties": {
                "email": person["email"],
                "firstname": person["name"],
                "hs_object_id": contact_id,
                "createdate": person["created_at"],
            },
            "createdAt": person["created_at"],
            "updatedAt": person["created_at"],
            "archived": False,
        }

    def _add_contact(self, email: str, firstname: str | None) -> dict:
        person_id, _ = self.desk.store.find_or_create_person(email.strip().lower(), firstname or "")
        return self._contact_json(self.desk.store.person(person_id=person_id))

    def _contact(self, contact_id: str) -> dict | None:
        if not contact_id.isdigit() or int(contact_id) <= 100:
            return None
        return self.desk.store.person(person_id=int(contact_id) - 100)

    def hs_list_contacts(self):
        limit = (self.query.get("limit") or ["10"])[0]
        with self.desk.store.transaction():
            results = [self._contact_json(p) for p in self.desk.store.people()]
        self._send(200, {"results": results[: int(limit) if limit.isdigit() else 10]})

    def hs_get_contact(self, contact):
        id_property = (self.query.get("idProperty") or [None])[0]
        with self.desk.store.transaction():
            person = (
                self.desk.store.person(email=unquote(contact)) if id_property == "email" else self._contact(contact)
            )
        if person is None:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", "Object not found.  objectId are usually numeric."))
        else:
            self._send(200, self._contact_json(person))

    def hs_search_contacts(self):
        body = self._json_body()
        if body is None:
            return
        wanted = [
            f.get("value")
            for g in body.get("filterGroups") or []
            for f in g.get("filters") or []
            if f.get("propertyName") == "email" and f.get("operator") == "EQ"
        ]
        with self.desk.store.transaction():
            people = [self.desk.store.person(email=str(v)) for v in wanted]
            results = [self._contact_json(p) for p in people if p is not None]
        self._send(200, {"total": len(results), "results": results[: int(body.get("limit") or 10)]})

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

    def _associated(self, ticket_id: int, kind: str, link: dict) -> None:
        fields = self.desk.store.ticket(ticket_id, self._base_url())["fields"]
        associations = dict(fields.get("associations") or {})
        linked = associations.get(kind) or []
        if all(item["id"] != link["id"] for item in linked):
            associations[kind] = linked + [link]
            self.desk.store.update_fields(ticket_id, {}, {"associations": associations})

    def hs_associate_contact(self, ticket_id, contact_id):
        with self.desk.store.transaction():
            ticket = self.desk.store.ticket(int(ticket_id), self._base_url())
            person = self._contact(contact_id)
            if ticket is not None and person is not None:
                self._associated(int(ticket_id), "contacts", {"id": contact_id, "email": person["email"]})
                # HubSpot keeps no roles: the first contact is the requester here, the later ones are CCs.
                requester = self.desk.store.ticket_people(int(ticket_id))["requester"]
                if person["email"].lower() != requester:
                    self.desk.store.add_ticket_person(
                        int(ticket_id), person["email"], "cc" if requester else "requester"
                    )
        if ticket is None or person is None:
            self._send(404, hubspot_error("OBJECT_NOT_FOUND", "one of the objects does not exist"))
            return
        spec = {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 16}
        self._send(
            200,
            {
                "status": "COMPLETE",
                "results": [{"from": {"id": ticket_id}, "to": {"id": contact_id}, "associationSpec": spec}],
                "startedAt": _now(),
                "completedAt": _now(),
            },
        )

    def hs_associate_ticket(self, ticket_id, other_id):
        base = self._base_url()
        with self.desk.store.transaction():
            found = all(self.desk.store.ticket(int(i), base) is not None for i in (ticket_id, other_id))
            if found and ticket_id != other_id:
                # A default ticket-to-ticket association reads back from both tickets.
                self._associated(int(ticket_id), "tickets", {"id": other_id})
                self._associated(int(other_id), "tickets", {"id": ticket_id})
        if not found or ticket_id == other_id:
            self._send(
                404 if not found else 400,
                hubspot_error(
                    "OBJECT_NOT_FOUND" if not found else "VALIDATION_ERROR", "cannot associate these tickets"
                ),
            )
            return
        self._send(
            200,
            {
                "status": "COMPLETE",
                "results": [
                    {
                        "from": {"id": ticket_id},
                        "to": {"id": other_id},
                        "associationSpec": {"associationCategory": "HUBSPOT_DEFINED"},
                    }
                ],
                "startedAt": _now(),
                "completedAt": _now(),
            },
        )

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
            self._files().clear()
            self.desk.__dict__.pop("hubspot_folders", None)
        super().control_reset()
