"""The admin consent flow: an admin connects a mailbox to Microsoft 365 or Google (OAuth 2.0 authorization code
with PKCE and a session-bound state), the tokens land behind the mailbox's credentials_ref (intake.secret_store),
and expiring or refused credentials are shown where admins look (selectors)."""
