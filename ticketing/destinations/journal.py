"""Where a multi-step write notes its progress, so that the next attempt goes on instead of starting over.

An upload made before a create (a Zendesk upload token, a Jira temporary file) is reused while it is
valid; a record the create made is not made again; a file attached after the create is marked `sent`
before its call and `done` after, and a file found `sent` is looked up on the record before it is sent
again (ticketing.destinations.files). The pipeline gives adapters `ticketing.intents.progress.IntentJournal`,
which writes each step to `Intent.progress` under the attempt's claim; `MemoryJournal` keeps it for one
adapter object (tests, "test connection", the dry run).
"""


class Journal:
    """A small key -> JSON-value store for one intent. Subclasses implement `get` and `put`."""

    def get(self, name: str, default=None):
        raise NotImplementedError

    def put(self, name: str, value) -> None:
        """Record `value` under `name` durably before returning (the next step may be a side effect)."""
        raise NotImplementedError


class MemoryJournal(Journal):
    def __init__(self, data: dict | None = None):
        self.data = dict(data or {})

    def get(self, name: str, default=None):
        return self.data.get(name, default)

    def put(self, name: str, value) -> None:
        self.data[name] = value
