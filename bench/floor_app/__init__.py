"""The framework floor for bench/ingest.py: a bare Django view doing the webhook's HMAC check and
the one-statement insert, and nothing else. Lives only in bench/ (gunicorn loads it with
`--pythonpath bench`); the product never imports it."""
