"""How long normalization takes per message: parse + validate of a typical 2.4 KB message,
of each message of the real-world corpus (tests/corpus), and of the worst cases of the
malformed corpus. Prints figures; asserts nothing.

    .venv/bin/python bench/parse.py
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("MAILROOM_ENV", "development")

import django  # noqa: E402

django.setup()

from intake.mime import parse_message  # noqa: E402
from intake.validation import MailboxPolicy, validate  # noqa: E402
from tests.test_mime import generated_corpus, typical_message  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"


def timed(raw: bytes, repeat: int) -> list[float]:
    policy = MailboxPolicy(allowed_recipients=("support@acme.test",))
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        validate(parse_message(raw), policy)
        samples.append(time.perf_counter() - started)
    return samples


def main():
    raw = typical_message()
    timed(raw, 20)  # warm-up
    samples = timed(raw, 2000)
    print(
        f"typical message ({len(raw)} bytes): parse+validate median {statistics.median(samples) * 1e6:.0f} us, "
        f"p99 {sorted(samples)[int(len(samples) * 0.99)] * 1e6:.0f} us"
    )
    corpus = sorted(CORPUS.glob("*.eml"))
    per_message = []
    for path in corpus:
        body = path.read_bytes()
        timed(body, 5)
        per_message.append((statistics.median(timed(body, 50)), path.name))
    per_message.sort()
    print(
        f"real-world corpus ({len(corpus)} messages of tests/corpus): median per message "
        f"{statistics.median(s for s, _ in per_message) * 1e6:.0f} us, slowest {per_message[-1][0] * 1e3:.2f} ms "
        f"({per_message[-1][1]})"
    )
    worst = sorted(((max(timed(body, 1)), name, len(body)) for name, body in generated_corpus()), reverse=True)[:5]
    print("slowest malformed messages:")
    for seconds, name, size in worst:
        print(f"  {name:40s} {size:>10,d} bytes  {seconds * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
