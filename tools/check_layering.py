"""Import layering check: imports between Mailroom's packages point downward only (docs/design.md §3).

    python tools/check_layering.py [ROOT]      # ROOT: the repository root (default: this file's parent's parent)

Every `.py` file under ROOT's packages is parsed with `ast` (nothing is imported or run), and every
import counts, wherever it is written: module level, inside a function (a lazy import), under
`if TYPE_CHECKING:`, in a migration. `importlib.import_module("...")` and `__import__("...")` with a
literal name count too. Names in strings (settings, `include("intake.urls")`, Celery task names such as
`relay.TOPIC_TASKS`) are references by name, not imports, and are not checked.

The rules:

    reconciliation  may import ticketing, intake
    ticketing       may import intake                (not reconciliation)
    intake          imports neither ticketing nor reconciliation
    apps            import `fakedesk` only from the `manage.py fakedesk` and `manage.py drill` commands, and `config`
                    only as `config.celery` (the Celery app object); never `config.settings` (use
                    django.conf.settings), `config.urls`, ...
    config          wiring only: from the apps it may import the `urls`, `views` and `apps` modules
                    (config/urls.py routes /healthz to intake.views), nothing else: no `models`,
                    `services`, `selectors`, `tasks`, no package `__init__`. Apps are named in settings
                    by string (INSTALLED_APPS, MIDDLEWARE, beat schedule, logging), which is allowed.
    fakedesk        standard library only (no Django, no Mailroom package); its pytest_plugin.py may
                    also import pytest

Exit status: 0 when every import keeps the rules, 1 with one line per violation otherwise
(`path:line: ...`), 2 when ROOT has none of the packages.
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

APPS = ("intake", "ticketing", "reconciliation")
PACKAGES = ("config", *APPS, "fakedesk")

# What each app may import among the apps (besides itself).
APP_MAY_IMPORT = {
    "intake": set(),
    "ticketing": {"intake"},
    "reconciliation": {"ticketing", "intake"},
}
# The modules of an app that config may import: wiring, not logic.
CONFIG_MAY_IMPORT_FROM_APPS = {"urls", "views", "apps"}
# The modules of config that an app may import.
APPS_MAY_IMPORT_FROM_CONFIG = {"config.celery"}
# The only product modules that may import fakedesk (`manage.py fakedesk`, and `manage.py drill`, which
# starts its own FakeDesk in process).
FAKEDESK_IMPORTERS = {"ticketing/management/commands/fakedesk.py", "reconciliation/management/commands/drill.py"}
# Beyond the standard library, what a fakedesk module may import.
FAKEDESK_EXTRA = {"fakedesk/pytest_plugin.py": {"pytest"}}

SKIP_DIRS = {"__pycache__", ".venv", "node_modules"}


@dataclass(frozen=True)
class Import:
    module: str  # the dotted name imported, made absolute
    line: int
    lazy: bool  # inside a function or method


@dataclass(frozen=True)
class Violation:
    path: str  # relative to the root, with forward slashes
    line: int
    imported: str
    lazy: bool
    rule: str

    def __str__(self) -> str:
        where = "function-level import" if self.lazy else "import"
        return f"{self.path}:{self.line}: {where} of {self.imported}: {self.rule}"


def module_name(relpath: Path) -> str:
    parts = list(relpath.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(current_package: str, level: int, module: str | None) -> str:
    base = current_package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_submodule(root: Path, dotted: str) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(root: Path, relpath: Path) -> list[Import]:
    """Every import in one file, with relative names resolved and `from x import submodule` expanded."""
    source = (root / relpath).read_text(encoding="utf-8", errors="replace")
    tree = ast.parse(source, filename=str(relpath))
    name = module_name(relpath)
    package = name if relpath.name == "__init__.py" else name.rpartition(".")[0]

    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(package, node.level, node.module) if node.level else (node.module or "")
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if alias.name != "*" else base
                # `from intake import views` imports the module intake.views; `from intake.models import
                # Tenant` imports (the module) intake.models.
                target = candidate if alias.name != "*" and _is_submodule(root, candidate) else base
                found.append(Import(target, node.lineno, lazy))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found.append(Import(node.args[0].value, node.lineno, lazy))
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return list(dict.fromkeys(found))  # `from x import a, b`: one import of x, reported once


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    named = (isinstance(func, ast.Name) and func.id in {"import_module", "__import__"}) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module")
    return (named and len(node.args) >= 1 and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."))


def _top(dotted: str) -> str:
    return dotted.split(".", 1)[0]


def rule_broken(relpath: str, importer: str, imported: str) -> str | None:
    """Why `importer` (a top-level package) must not import `imported` (a dotted name), or None."""
    target = _top(imported)
    if target == importer:
        return None
    if importer in APPS:
        if target in APPS and target not in APP_MAY_IMPORT[importer]:
            allowed = ", ".join(sorted(APP_MAY_IMPORT[importer])) or "no other app"
            return f"{importer} must not import {target} (layers point downward; {importer} may import {allowed})"
        if target == "fakedesk" and relpath not in FAKEDESK_IMPORTERS:
            return ("only the fakedesk and drill management commands import fakedesk "
                    "(the test stand-in is not product logic)")
        if target == "config" and not any(imported == m or imported.startswith(m + ".")
                                          for m in APPS_MAY_IMPORT_FROM_CONFIG):
            return (f"{importer} may import only {', '.join(sorted(APPS_MAY_IMPORT_FROM_CONFIG))} from config "
                    "(settings through django.conf.settings)")
        return None
    if importer == "config":
        if target in APPS:
            parts = imported.split(".")
            if len(parts) < 2 or parts[-1] not in CONFIG_MAY_IMPORT_FROM_APPS:
                return ("config holds no app logic: from an app it may import only "
                        f"{'/'.join(sorted(CONFIG_MAY_IMPORT_FROM_APPS))} modules (wiring)")
        if target == "fakedesk":
            return "config holds no app logic and does not import fakedesk"
        return None
    if importer == "fakedesk":
        extra = FAKEDESK_EXTRA.get(relpath, set())
        if target in sys.stdlib_module_names or target in extra:
            return None
        if target in APPS or target == "config":
            return "fakedesk imports nothing of Mailroom (it is shipped beside the apps, standard library only)"
        return f"fakedesk is standard library only (no Django); {target} is not in the standard library"
    return None


def python_files(root: Path, package: str):
    base = root / package
    if not base.is_dir():
        return
    for path in sorted(base.rglob("*.py")):
        if not SKIP_DIRS.intersection(path.relative_to(root).parts):
            yield path.relative_to(root)


def check(root: Path | str) -> tuple[list[Violation], int]:
    """The violations under `root`, and how many files were checked."""
    root = Path(root).resolve()
    violations: list[Violation] = []
    checked = 0
    for package in PACKAGES:
        for relpath in python_files(root, package):
            checked += 1
            posix = relpath.as_posix()
            try:
                found = imports_of(root, relpath)
            except SyntaxError as exc:
                violations.append(Violation(posix, exc.lineno or 0, "?", False, f"cannot parse: {exc.msg}"))
                continue
            for imp in found:
                why = rule_broken(posix, package, imp.module)
                if why:
                    violations.append(Violation(posix, imp.line, imp.module, imp.lazy, why))
    return violations, checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent),
                        help="repository root holding config/, intake/, ticketing/, reconciliation/, fakedesk/")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not any((root / p).is_dir() for p in PACKAGES):
        print(f"check_layering: none of {', '.join(PACKAGES)} under {root}", file=sys.stderr)
        return 2
    violations, checked = check(root)
    for violation in violations:
        print(violation)
    if violations:
        print(f"check_layering: {len(violations)} layering violation(s) in {checked} files "
              "(rules: tools/check_layering.py, docs/design.md §3)", file=sys.stderr)
        return 1
    print(f"check_layering: {checked} files, imports point downward only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
