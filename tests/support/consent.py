"""The OAuth consent flow's stub authorization server settings and a mailbox that uses it."""

import json

from tests.factories import make_mailbox

CALLBACK = "/admin/intake/mailbox/oauth/callback/"
CLIENT_SECRET = "app-secret-value"


def oauth_mailbox(tenant, secrets_dir, stub, provider="graph", ref_name="graph.json", **settings):
    folder = secrets_dir / tenant.slug
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "client-secret").write_text(CLIENT_SECRET)
    base = {
        "authorize_url": f"{stub.url}/authorize",
        "token_url": f"{stub.url}/token",
        "client_id": "consent-app",
        "client_secret_ref": f"file:{folder}/client-secret",
    }
    return make_mailbox(
        tenant, provider=provider, credentials_ref=f"file:{folder}/{ref_name}", settings={**base, **settings}
    )


def credentials_of(mailbox) -> dict | None:
    path = mailbox.credentials_ref.removeprefix("file:")
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
