"""What test modules share: helpers, constants and fixtures, grouped by topic (one module each).

A test module never imports another test module (`tests/test_layering.py` checks it): what two of them
need lives here. Fixtures are imported by name where they are used
(`from tests.support.queue import seeded  # noqa: F401  (fixture)`), as those of `tests.live` and
`tests.browser` are. Older helper modules that are not tests (`tests/factories.py`, `tests/live.py`,
`tests/mail.py`, ...) stay where they are.
"""
