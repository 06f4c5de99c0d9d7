"""The corpus manifest: `tests/corpus/manifest.json`, then each `tests/corpus/manifest-*.json`
(one per topic of real mail), in name order. Each file is a JSON list of cases, one per `.eml`
file (the keys: tests/test_real_mail_corpus.py)."""

import json
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"


def manifest_files() -> list[Path]:
    return [CORPUS / "manifest.json", *sorted(CORPUS.glob("manifest-*.json"))]


def load_manifest() -> list[dict]:
    cases = []
    for path in manifest_files():
        cases.extend(json.loads(path.read_text(encoding="utf-8")))
    return cases
