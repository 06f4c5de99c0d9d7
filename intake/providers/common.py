"""What the API providers (Gmail, Microsoft Graph) share beyond `Provider`.

Both poll a JSON API with OAuth access tokens (`intake.providers.oauth`), page by
page over a resync window, and fetch a message's MIME only when the mailbox has
not stored it yet.
"""

from intake.models import InboxEvent

from .base import FetchedMessage, PollBatch, Provider
from .oauth import ApiClient, TokenSource


class ApiProvider(Provider):
    """Reads the settings both providers take and owns their API client.

    `Mailbox.settings`: `page_size` (`default_page_size`, at most `largest_page_size`;
    `batch_size`, the polling service's per-poll override, wins over it),
    `resync_days` (`default_resync_days`; 0 is allowed), `client_id`.
    A subclass builds `self._client` on first use, with `token_source()`;
    `close()` closes its session.
    """

    default_page_size = 50
    largest_page_size = 1000
    default_resync_days = 7

    def __init__(self, mailbox):
        super().__init__(mailbox)
        settings = mailbox.settings or {}
        self.settings = settings
        page_size = settings.get("batch_size") or settings.get("page_size") or self.default_page_size
        self.page_size = max(1, min(self.largest_page_size, int(page_size)))
        resync_days = settings.get("resync_days")
        self.resync_days = max(0, int(self.default_resync_days if resync_days is None else resync_days))
        self._client: ApiClient | None = None

    def close(self) -> None:
        if self._client is not None:
            self._client.session.close()
            if self._client.tokens.session is not None:
                self._client.tokens.session.close()

    def token_source(self, token_url: str, **options) -> TokenSource:
        """Access tokens for the mailbox's `credentials_ref`; `client_id` may come from its settings."""
        return TokenSource(
            token_url=token_url,
            credentials_ref=self.mailbox.credentials_ref,
            tenant=self.mailbox.tenant,
            owner=self.mailbox,
            client_id=str(self.settings.get("client_id") or ""),
            **options,
        )

    def with_archive(self, batch: PollBatch, cursor: dict) -> PollBatch:
        """`batch` (live mail) while an archive import runs: live mail first, so it is ticketed as usual from the
        start, then the history one page at a time (`archive_page`), its place under the cursor's "archive"."""
        before = self.mailbox.archive_before
        if before is None or self.mailbox.archive_done_at is not None:
            return batch
        state = (cursor or {}).get("archive")
        if not isinstance(state, dict) or state.get("before") != before.isoformat():
            state = {"before": before.isoformat()}
        if batch.messages or batch.more:
            return PollBatch(batch.messages, {**batch.cursor, "archive": state}, more=True)
        history, state, done = self.archive_page(state)
        return PollBatch(history, {**batch.cursor, "archive": state}, more=not done, archive_done=done)

    def archive_page(self, state: dict) -> tuple[list[FetchedMessage], dict, bool]:
        """Subclasses that import archives must provide: one page of the mail received before the cut-off, from
        `state` (the cursor's "archive" entry), as (messages with history=True, the next state, done)."""
        raise NotImplementedError

    def not_yet_stored(self, ids: list[str]) -> list[str]:
        """`ids` without repeats and without the messages this mailbox already stored, in their order.

        One query for the whole page; `ingest` still absorbs a message stored meanwhile.
        """
        ids = list(dict.fromkeys(ids))
        known = (
            set(
                InboxEvent.objects.filter(mailbox=self.mailbox, provider_message_id__in=ids).values_list(
                    "provider_message_id", flat=True
                )
            )
            if ids
            else set()
        )
        return [message_id for message_id in ids if message_id not in known]
