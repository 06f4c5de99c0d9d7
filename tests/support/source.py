"""The apps' source files, for checks that read the code with `ast`."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
APPS = ("intake", "ticketing", "reconciliation")


def app_modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in relative:
                yield relative, path
