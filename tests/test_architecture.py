"""The tree's import rules (docs/architecture.md): imports go down the layers, commands never
import each other, and no module imports itself back through others (no import circle). Reads the
source with `ast` (imports inside functions count too); imports nothing of dtcli."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dtcli"

# A component (a top-level module or package of dtcli) may import its own layer's components or
# lower ones, never a higher layer's. The same order as docs/architecture.md.
LAYERS: list[set[str]] = [
    {"errors", "storage", "tfruntime", "tables", "cpuinfo"},
    {"mesh", "devices", "cluster", "hf"},
    {"recipe"},
    {"data", "pipeline", "models", "layout", "optimizers", "checkpoint", "metrics", "stretches"},
    {
        "session",
        "steps",
        "rundir",
        "progress",
        "runlog",
        "plot",
        "memory",
        "published",
        "infer",
        "harness",
        "children",
        "track",
    },
    {
        "train",
        "evaluate",
        "generate",
        "score",
        "export",
        "plan",
        "autoplan",
        "doctor",
        "launch",
        "import_hf",
        "sweep",
    },
    {"cli", "terminal", "__main__"},
]
COMMANDS = LAYERS[5]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The dtcli modules `path` imports, anywhere in it: `from dtcli.a import b` is dtcli.a.b when
    b is a module, else dtcli.a."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dtcli"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            if not base.startswith("dtcli"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    found.discard(me)
    return {m for m in found if m in modules and m != "dtcli"}


def _component(module: str) -> str:
    return module.split(".")[1]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def test_every_component_has_a_layer():
    components = {_component(m) for m in _modules() if m != "dtcli"}
    assert components - set(LAYER) == set(), "add the new module to LAYERS and the architecture doc"


def test_imports_go_down_the_layers():
    upward = sorted(
        f"{src} imports {dst}"
        for src, dsts in _graph().items()
        if src != "dtcli"
        for dst in dsts
        if LAYER[_component(dst)] > LAYER[_component(src)]
    )
    assert upward == []


def test_no_command_imports_another():
    crossing = sorted(
        f"{src} imports {dst}"
        for src, dsts in _graph().items()
        if src != "dtcli" and _component(src) in COMMANDS
        for dst in dsts
        if _component(dst) in COMMANDS and _component(dst) != _component(src)
    )
    assert crossing == []


# The CLI package's own modules; every other module of it holds commands (docs/architecture.md).
CLI_FRAME = {"dtcli.cli", "dtcli.cli.__main__", "dtcli.cli.app", "dtcli.cli.entry"}
CLI_SHARED = "dtcli.cli.options"


def test_no_cli_command_module_imports_another():
    # A command module of cli/ imports the shared options and the library, never another
    # command module (cli/app.py registers them all).
    graph = _graph()
    commands = {m for m in graph if m.startswith("dtcli.cli.")} - CLI_FRAME - {CLI_SHARED}
    assert commands, "the walker finds the CLI's command modules"
    crossing = sorted(
        f"{src} imports {dst}"
        for src in sorted(commands | {CLI_SHARED})
        for dst in graph[src]
        if dst.startswith("dtcli.cli") and dst != CLI_SHARED
    )
    assert crossing == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in `graph`, as the list of its nodes, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_between_modules():
    assert _cycle(_graph()) is None


def test_no_import_circle_between_components():
    graph: dict[str, set[str]] = {}
    for src, dsts in _graph().items():
        if src == "dtcli":
            continue
        graph.setdefault(_component(src), set()).update(
            _component(d) for d in dsts if _component(d) != _component(src)
        )
    assert _cycle(graph) is None


def test_the_walker_sees_a_circle_and_an_upward_import():
    # The checks above pass on an empty answer: show that the walker finds what they look for.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    graph = _graph()
    assert "dtcli.recipe" in graph["dtcli.cli"] or any(
        _component(d) == "recipe" for d in graph["dtcli.plan"]
    )


# The tree's size habits (docs/architecture.md): a module that grows past them gets split along
# a seam, a function that grows past them gets its parts named.
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for name, path in _modules().items():
        text = path.read_text()
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions[f"{name}.{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
    return modules, functions


def test_modules_and_functions_keep_to_the_size_habits():
    modules, functions = _sizes()
    assert len(functions) > 300  # the walker saw the package
    assert {m: n for m, n in modules.items() if n > MAX_MODULE_LINES} == {}
    assert {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES} == {}
