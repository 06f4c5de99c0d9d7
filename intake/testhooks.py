"""Named pause points, so a test can stop a worker or a poller at an exact moment and SIGKILL it there.

Inert unless the process was started with `MAILROOM_PAUSE_AT=<point>:<path>`.
At that point the process writes its pid to `<path>.reached` and then waits
until `<path>.release` exists (a test that kills it simply never creates it).

It lives in intake, the lowest app, so that every app above can use it too
(ticketing's workers pause here as well as intake's poller).
"""

import os
import time
from pathlib import Path

ENV = "MAILROOM_PAUSE_AT"


def pause_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, path = spec.partition(":")
    if point != name or not path:
        return
    Path(f"{path}.reached").write_text(str(os.getpid()))
    release = Path(f"{path}.release")
    while not release.exists():
        time.sleep(0.05)
