"""`make lint` and the registry tests refuse what they are there to refuse, shown on a copy of the tree with the
fault planted: a model change without its migration (a new AuditKind), and a destination kind nobody registered.
(A planted import cycle: tests/test_layering.py.)

Each case runs the real command in a subprocess on the copy, and first runs it on the unchanged copy, which
must pass: a check that fails on everything proves nothing.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREE = (
    "config",
    "intake",
    "ticketing",
    "reconciliation",
    "fakedesk",
    "tools",
    "tests",
    "templates",
    "manage.py",
    "pyproject.toml",
)
LINT_ENV = {"MAILROOM_ENV": "development", "DATABASE_URL": "sqlite://:memory:"}


@pytest.fixture
def tree(tmp_path) -> Path:
    copy = tmp_path / "tree"
    copy.mkdir()
    for name in TREE:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "corpus"))
        else:
            shutil.copy2(source, copy / name)
    return copy


def run(copy: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    environ.update(env or {}, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, *args], cwd=copy, env=environ, capture_output=True, text=True, timeout=240)


def plant(path: Path, after: str, line: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert after in text, f"{path.name} no longer has {after!r}: update the plant"
    path.write_text(text.replace(after, after + line, 1), encoding="utf-8")


def migrations_check(copy: Path) -> subprocess.CompletedProcess:
    return run(copy, "manage.py", "makemigrations", "--check", "--dry-run", env=LINT_ENV)


def test_a_new_audit_kind_without_its_migration_fails_the_migrations_check(tree):
    assert migrations_check(tree).returncode == 0, migrations_check(tree).stdout  # the tree as it is passes
    plant(
        tree / "intake" / "vocabulary.py",
        "class AuditKind(TextChoices):\n",
        '    PLANTED = "planted", "Planted by tests/test_lint_plants.py"\n',
    )
    result = migrations_check(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "intake" in result.stdout  # names the app whose migration is missing


def test_a_destination_kind_nobody_registered_fails_the_registry_test_and_the_migrations_check(tree):
    registry = (
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "tests/test_registries.py::test_every_registered_kind_is_a_model_choice_and_every_choice_has_an_adapter",
    )
    env = {"DATABASE_URL": os.environ.get("DATABASE_URL", "")}
    before = run(tree, *registry, env=env)
    assert before.returncode == 0, before.stdout + before.stderr
    plant(
        tree / "ticketing" / "models.py",
        '    REST = "rest", "Generic REST"\n',
        '    PLANTED = "planted", "Planted by tests/test_lint_plants.py"\n',
    )
    after = run(tree, *registry, env=env)
    assert after.returncode == 1, after.stdout + after.stderr
    assert "planted" in after.stdout  # the assertion's diff names the kind
    assert migrations_check(tree).returncode == 1  # and the kind's choice needs its migration
