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

And no cycles: the imports between modules (lazy ones included, since a function-level import is how
a cycle hides; not those under `if TYPE_CHECKING:`, which never run) form no strongly connected
component of two or more modules. An import names the module it loads: `from intake.mime import
parse_message` is an import of the package `intake.mime` (its `__init__`), `from intake.mime import
parse` of the module `intake.mime.parse`; the implicit import of a module's parent packages is not an
edge (every submodule would otherwise close a loop with a package that re-exports it).

    python tools/check_layering.py --cycles    # only the cycle check, one line per cycle

Exit status: 0 when every import keeps the rules, 1 with one line per violation or cycle otherwise
(`path:line: ...`, `cycle: a -> b -> a`), 2 when ROOT has none of the packages.
"""

from __future__ import annotations

import argparse
import ast
import itertools
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
    typing_only: bool = False  # under `if TYPE_CHECKING:`: never run, so no edge of a runtime cycle


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

    def visit(node: ast.AST, lazy: bool, typing_only: bool = False) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, lazy, typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(package, node.level, node.module) if node.level else (node.module or "")
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if alias.name != "*" else base
                # `from intake import views` imports the module intake.views; `from intake.models import
                # Tenant` imports (the module) intake.models.
                target = candidate if alias.name != "*" and _is_submodule(root, candidate) else base
                found.append(Import(target, node.lineno, lazy, typing_only))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found.append(Import(node.args[0].value, node.lineno, lazy, typing_only))
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, inner, True)
            for child in node.orelse:
                visit(child, inner, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, inner, typing_only)

    visit(tree, False)
    return list(dict.fromkeys(found))  # `from x import a, b`: one import of x, reported once


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    named = (isinstance(func, ast.Name) and func.id in {"import_module", "__import__"}) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    return (
        named
        and len(node.args) >= 1
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and not node.args[0].value.startswith(".")
    )


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
            return (
                "only the fakedesk and drill management commands import fakedesk "
                "(the test stand-in is not product logic)"
            )
        if target == "config" and not any(
            imported == m or imported.startswith(m + ".") for m in APPS_MAY_IMPORT_FROM_CONFIG
        ):
            return (
                f"{importer} may import only {', '.join(sorted(APPS_MAY_IMPORT_FROM_CONFIG))} from config "
                "(settings through django.conf.settings)"
            )
        return None
    if importer == "config":
        if target in APPS:
            parts = imported.split(".")
            if len(parts) < 2 or parts[-1] not in CONFIG_MAY_IMPORT_FROM_APPS:
                return (
                    "config holds no app logic: from an app it may import only "
                    f"{'/'.join(sorted(CONFIG_MAY_IMPORT_FROM_APPS))} modules (wiring)"
                )
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


def import_graph(root: Path | str) -> dict[str, dict[str, tuple[str, int]]]:
    """module -> {imported module inside PACKAGES: (path, line) of the first such import}."""
    root = Path(root).resolve()
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for package in PACKAGES:
        for relpath in python_files(root, package):
            name = module_name(relpath)
            edges = graph.setdefault(name, {})
            try:
                found = imports_of(root, relpath)
            except SyntaxError:
                continue  # check() reports it
            for imp in found:
                if (
                    not imp.typing_only
                    and _top(imp.module) in PACKAGES
                    and imp.module != name
                    and _is_submodule(root, imp.module)
                ):
                    edges.setdefault(imp.module, (relpath.as_posix(), imp.line))
    return graph


def cycles(graph: dict[str, dict[str, tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan), each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # Iterative depth-first search: (node, iterator over its successors).
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe_cycle(component: list[str], graph: dict[str, dict[str, tuple[str, int]]]) -> str:
    """One loop through `component`, with where each import is written: `cycle: a -> b -> a (a.py:3, b.py:9)`."""
    members = set(component)
    path = [component[0]]
    seen = {component[0]}
    while True:  # follow edges inside the component until one returns to a module on the path
        nxt = next(m for m in sorted(graph[path[-1]]) if m in members)
        if nxt in seen:
            loop = path[path.index(nxt) :] + [nxt]
            break
        path.append(nxt)
        seen.add(nxt)
    where = ", ".join(f"{graph[a][b][0]}:{graph[a][b][1]}" for a, b in itertools.pairwise(loop))
    extra = (
        f"; {len(component)} modules in the component: {', '.join(component)}" if len(component) > len(loop) - 1 else ""
    )
    return f"cycle: {' -> '.join(loop)} ({where}){extra}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "root",
        nargs="?",
        default=str(Path(__file__).resolve().parent.parent),
        help="repository root holding config/, intake/, ticketing/, reconciliation/, fakedesk/",
    )
    parser.add_argument("--cycles", action="store_true", help="only the cycle check")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if not any((root / p).is_dir() for p in PACKAGES):
        print(f"check_layering: none of {', '.join(PACKAGES)} under {root}", file=sys.stderr)
        return 2
    graph = import_graph(root)
    loops = [describe_cycle(component, graph) for component in cycles(graph)]
    for loop in loops:
        print(loop)
    if args.cycles:
        if loops:
            print(f"check_layering: {len(loops)} import cycle(s) among {len(graph)} modules", file=sys.stderr)
            return 1
        print(f"check_layering: {len(graph)} modules, no import cycle")
        return 0
    violations, checked = check(root)
    for violation in violations:
        print(violation)
    if loops:
        print(
            f"check_layering: {len(loops)} import cycle(s) (a module must not reach itself through its imports)",
            file=sys.stderr,
        )
        return 1
    if violations:
        print(
            f"check_layering: {len(violations)} layering violation(s) in {checked} files "
            "(rules: tools/check_layering.py, docs/design.md §3)",
            file=sys.stderr,
        )
        return 1
    print(f"check_layering: {checked} files, imports point downward only, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
