"""Imports point downward only: tools/check_layering.py on the real tree and on small fake trees; and no
test module imports another (what test modules share lives in tests/support/).

Pure: no database, no Django app code is imported (the checks read files with `ast`).
"""

import ast
import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "tools" / "check_layering.py"

_spec = importlib.util.spec_from_file_location("check_layering", SCRIPT)
check_layering = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("check_layering", check_layering)
_spec.loader.exec_module(check_layering)


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write a package tree: {"intake/x.py": "source"}; every folder on the way gets an __init__.py."""
    for relpath, source in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(root).parents:
            if folder != Path(".") and not (root / folder / "__init__.py").exists():
                (root / folder / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(source))
    return root


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


def violations(root: Path) -> list[tuple[str, int, str]]:
    found, _ = check_layering.check(root)
    return sorted((v.path, v.line, v.imported) for v in found)


def test_the_real_tree_keeps_the_layers():
    found, checked = check_layering.check(REPO_ROOT)
    assert checked > 50
    assert found == [], "\n".join(map(str, found))
    done = run(REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_upward_import_is_reported_with_its_file_and_line(tmp_path):
    tree(
        tmp_path,
        {
            "ticketing/models.py": "class Intent: ...\n",
            "intake/x.py": "import os\n\nfrom ticketing.models import Intent\n",
        },
    )
    done = run(tmp_path)
    assert done.returncode == 1
    assert "intake/x.py:3: import of ticketing.models: intake must not import ticketing" in done.stdout
    assert "1 layering violation" in done.stderr


def test_a_lazy_import_counts(tmp_path):
    tree(
        tmp_path,
        {
            "ticketing/services.py": """\
            def process():
                from reconciliation.services import do_replay
                return do_replay
            """,
            "reconciliation/services.py": "def do_replay(): ...\n",
        },
    )
    [violation], _ = check_layering.check(tmp_path)
    assert (violation.path, violation.line, violation.imported, violation.lazy) == (
        "ticketing/services.py",
        2,
        "reconciliation.services",
        True,
    )
    assert "function-level import" in str(violation)


@pytest.mark.parametrize(
    "source",
    [
        "import ticketing.tasks\n",
        "from ticketing import tasks\n",
        "from importlib import import_module\nimport_module('ticketing.tasks')\n",
        "if False:\n    from reconciliation.models import RecoveryItem\n",
    ],
)
def test_every_spelling_of_an_upward_import_is_caught(tmp_path, source):
    tree(tmp_path, {"intake/relay.py": source, "ticketing/tasks.py": "", "reconciliation/models.py": ""})
    assert [path for path, _, _ in violations(tmp_path)] == ["intake/relay.py"]


def test_downward_and_relative_imports_are_allowed(tmp_path):
    tree(
        tmp_path,
        {
            "intake/models.py": "",
            "intake/mime/parse.py": "from ..models import *\nfrom . import headers\n",
            "intake/mime/headers.py": "",
            "ticketing/services.py": "from intake.models import InboxEvent\nimport django.db\n",
            "reconciliation/admin.py": "from ticketing import services\nfrom intake import models\n",
            "ticketing/management/commands/fakedesk.py": "from fakedesk.cli import main\n",
            "fakedesk/cli.py": "import argparse\nimport http.server\nfrom . import desk\n",
            "fakedesk/desk.py": "",
            "fakedesk/pytest_plugin.py": "import pytest\n",
        },
    )
    assert violations(tmp_path) == []


def test_config_may_wire_urls_and_views_but_not_import_logic(tmp_path):
    tree(
        tmp_path,
        {
            "intake/views.py": "",
            "intake/urls.py": "",
            "intake/services.py": "",
            "intake/models.py": "",
            "config/urls.py": "from django.urls import include\nfrom intake import views\nimport intake.urls\n",
            "config/celery.py": "from intake.services import ingest\n",
            "config/settings.py": "INSTALLED_APPS = ['intake']\nfrom intake import models\n",
        },
    )
    assert violations(tmp_path) == [
        ("config/celery.py", 1, "intake.services"),
        ("config/settings.py", 2, "intake.models"),
    ]


def test_apps_import_only_the_celery_app_from_config(tmp_path):
    tree(
        tmp_path,
        {
            "config/celery.py": "",
            "config/settings.py": "",
            "intake/selectors.py": "def ready():\n    from config.celery import app\n",
            "intake/relay.py": "from config.settings import MAILROOM_RELAY_BATCH\n",
        },
    )
    assert violations(tmp_path) == [("intake/relay.py", 1, "config.settings")]


def test_fakedesk_is_standard_library_only_and_only_one_command_imports_it(tmp_path):
    tree(
        tmp_path,
        {
            "fakedesk/store.py": "import sqlite3\nfrom django.db import models\n",
            "fakedesk/client.py": "from intake.models import Tenant\n",
            "fakedesk/server.py": "import pytest\n",
            "intake/models.py": "",
            "ticketing/services.py": "import fakedesk\n",
        },
    )
    assert violations(tmp_path) == [
        ("fakedesk/client.py", 1, "intake.models"),
        ("fakedesk/server.py", 1, "pytest"),
        ("fakedesk/store.py", 2, "django.db"),
        ("ticketing/services.py", 1, "fakedesk"),
    ]


def test_a_root_without_the_packages_is_an_error_not_a_pass(tmp_path):
    done = run(tmp_path)
    assert done.returncode == 2 and "none of" in done.stderr


def test_the_real_tree_has_no_import_cycle():
    graph = check_layering.import_graph(REPO_ROOT)
    assert len(graph) > 50
    assert check_layering.cycles(graph) == []
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cycles", str(REPO_ROOT)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no import cycle" in done.stdout


def test_a_cycle_hidden_behind_a_function_level_import_is_refused(tmp_path):
    tree(
        tmp_path,
        {
            "ticketing/services.py": "from ticketing import bulkhead\n",
            "ticketing/bulkhead.py": (
                "def call():\n    from ticketing import services  # services imports this module\n"
            ),
        },
    )
    done = run(tmp_path)
    assert done.returncode == 1
    assert (
        "cycle: ticketing.bulkhead -> ticketing.services -> ticketing.bulkhead "
        "(ticketing/bulkhead.py:2, ticketing/services.py:1)"
    ) in done.stdout
    assert "1 import cycle" in done.stderr


def test_a_cycle_through_three_modules_is_one_component(tmp_path):
    tree(
        tmp_path,
        {
            "intake/mime/body.py": "from .parts import content_type\n",
            "intake/mime/parts.py": "from .walk import walk\n",
            "intake/mime/walk.py": "from intake.mime.body import text\n",
            "intake/mime/sniff.py": "from .body import text\n",  # reaches the loop but is not on it
        },
    )
    assert check_layering.cycles(check_layering.import_graph(tmp_path)) == [
        ["intake.mime.body", "intake.mime.parts", "intake.mime.walk"]
    ]


def test_imports_for_type_checking_only_and_parent_packages_close_no_cycle(tmp_path):
    tree(
        tmp_path,
        {
            "intake/models.py": "from intake.domains import address_key\n",
            "intake/domains.py": (
                "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from intake.models import Mailbox\n"
            ),
            "intake/mime/__init__.py": "from .parse import parse_message\n",
            "intake/mime/parse.py": "import os\n",  # its package re-exports it: loading parse loads the package first
        },
    )
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no cycle" in done.stdout


# --- tests: a test module imports helpers (tests/support/, tests/*.py), never another test module --------

TESTS = REPO_ROOT / "tests"
DOTTED_TEST_MODULE = re.compile(r"tests\.test_\w+(\.\w+)*")  # a string naming one: import_module, setattr


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return len(parts) > 1 and parts[0] == "tests" and parts[1].startswith("test_")


def imports_of_test_modules(source: str, package: str = "tests") -> list[tuple[int, str]]:
    """(line, module) for each import of a tests/test_*.py module in `source` (of a module in `package`): at
    any depth, relative or absolute, by a string naming it, or inside a string that is a Python script."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if is_test_module(base):
                found.append((node.lineno, base))
            found += [
                (node.lineno, f"{base}.{alias.name}")
                for alias in node.names
                if base == "tests" and alias.name.startswith("test_")
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if DOTTED_TEST_MODULE.fullmatch(node.value.strip()):
                found.append((node.lineno, node.value.strip()))
            elif "import" in node.value:  # a script run elsewhere (`manage.py shell -c`) imports too
                try:
                    inner = imports_of_test_modules(node.value)
                except (SyntaxError, ValueError):
                    continue
                found += [(node.lineno + line - 1, module) for line, module in inner]
    return found


def test_no_test_module_imports_another_test_module():
    problems, checked = [], 0
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(REPO_ROOT)
        package = ".".join(relative.parent.parts)
        checked += 1
        for line, module in imports_of_test_modules(path.read_text(encoding="utf-8"), package):
            problems.append(f"{relative}:{line}: imports {module} (move what it needs to tests/support/)")
    assert checked > 100
    assert problems == [], "\n".join(problems)


# The planted sources name tests.test_* only in pieces, so that this file passes the check above.
T = "tests." + "test_"


PLANTED = [
    f"from {T}api import make_user\n",
    f"import {T}api\n",
    f"import {T}api as api_tests\n",
    "from tests import " + "test_api\n",
    f"def helper():\n    from {T}recovery_queue import PASSWORD, make_user\n",
    "from ." + "test_api import make_user\n",
    f'SCRIPT = """\nimport json\nfrom {T}bulk_jobs import flood\n"""\n',
    f'importlib.import_module("{T}api")\n',
    f'monkeypatch.setattr("{T}api.API", "/api/v2")\n',
]


def test_the_check_flags_every_planted_import_of_a_test_module():
    for source in PLANTED:
        found = imports_of_test_modules(source)
        assert len(found) == 1 and found[0][1].startswith(T), (source, found)
    assert imports_of_test_modules(PLANTED[6]) == [(3, T + "bulk_jobs")]  # its line in the planted source


def test_the_check_lets_helpers_and_mentions_through():
    source = (
        '"""See tests/test_api.py and tests.test_api for the API\'s own tests."""\n'
        "from tests.support.users import PASSWORD, make_user\n"
        "from tests.live import REPO_ROOT\n"
        "from tests import support\n"
        "import tests.factories\n"
        "from . import mail\n"
        "from .support.api import api\n"
        'SCRIPT = "from tests.support.bulk import flood"\n'
        'NOT_PYTHON = "import it, then " + "test_x"\n'
    )
    assert imports_of_test_modules(source) == []
    assert imports_of_test_modules("from ..support.queue import new_event\n", "tests.support") == []
    assert imports_of_test_modules("from .." + "test_api import API\n", "tests.support") == [(1, T + "api")]


def private_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of each `from X import _name`: a private name taken across modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            found += [
                (node.lineno, a.name) for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_no_module_imports_another_modules_private_name():
    """A name that crosses modules is public; `_private` ones stay in their module (apps, tools, bench, tests)."""
    problems = []
    for top in ("config", "intake", "ticketing", "reconciliation", "fakedesk", "tools", "bench", "tests"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for line, name in private_imports(path.read_text(encoding="utf-8")):
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {name}")
    assert problems == [], "\n".join(problems)
    assert private_imports("from a.b import _hidden, shown\nfrom __future__ import annotations\n") == [(1, "_hidden")]
