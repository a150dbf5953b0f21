"""The project's modules import one way: no circle, and no arrow from the harness up into the
analysis (the house: kernels <- experiments <- analysis; hydra_plugins and scripts on top).

The graph is drawn from the sources with `ast`, nothing imported. Its edges:
- every `import` and `from ... import` in a file, at module level or inside a function (a lazy
  import is a dependency all the same), resolved to the project module it loads: `from pkg
  import name` is an edge to pkg.name where that is a module, else to pkg;
- a string that names a project module, as a whole ("experiments.blocks", imported by name:
  the registry's ENTRY_MODULES, importlib.import_module) or as "module:attribute" (the
  registry's targets, resolved on first use).
Not edges: a module name right after "-m" in a command (another process, which shares no
module with this one: experiments.bench running `python -m analysis.targets` is the analysis
called as its entry point), and a package's own __init__ running before its submodule (Python's
mechanics: the __init__ is the facade over the submodules, and an edge to it is drawn only
where a module imports a name from it).
"""

import ast
import functools
import re

from tests.conftest import REPO_ROOT

PACKAGES = ("kernels", "experiments", "analysis", "hydra_plugins", "scripts", "tests")
# the layers, bottom up: a module may import from its own layer and the ones below
LAYERS = {"kernels": 0, "experiments": 1, "analysis": 2, "hydra_plugins": 2}
TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # "module:attribute"


def project_modules() -> dict[str, object]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _containing(name: str, modules) -> str | None:
    """The project module that importing `name` loads last (its longest module prefix)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _command_modules(tree) -> set[int]:
    """ids of the string nodes that follow "-m" in a list or tuple: commands, not imports."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            for flag, value in zip(node.elts, node.elts[1:], strict=False):
                if isinstance(flag, ast.Constant) and flag.value == "-m":
                    skipped.add(id(value))
    return skipped


def edges(modules) -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line of the first such import}."""
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        commands = _command_modules(tree)
        out = {}

        def add(target, line, out=out, name=name):
            if target and target != name:
                out.setdefault(target, line)

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(_containing(alias.name, modules), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = ".".join(p for p in (anchor, node.module) if p)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    add(full if full in modules else _containing(base, modules), node.lineno)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in commands):  # fmt: skip
                text = node.value
                if text in modules:
                    add(text, node.lineno)
                elif TARGET.match(text):
                    add(_containing(text.partition(":")[0], modules), node.lineno)
        graph[name] = out
    return graph


@functools.cache
def project_graph() -> dict[str, dict[str, int]]:
    """edges(project_modules()), drawn once per test process."""
    return edges(project_modules())


def circles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_the_graph_sees_the_imports_it_must():
    """The drawing finds what it is meant to: a lazy import, a string the registry imports by
    name, a "module:attribute" target, and no edge for a `-m` command."""
    graph = project_graph()
    assert "experiments.op_table" in graph["experiments.single_ops"]
    assert "experiments.single_ops" in graph["experiments.registry"]  # ENTRY_MODULES
    assert "experiments.blocks" in graph["experiments.registry"]
    assert "kernels.ops" in graph["experiments.single_ops"]  # "kernels.ops:matmul"
    assert "kernels._common" in graph["experiments.single_ops"]  # imported inside a function
    assert "analysis.targets" not in graph["experiments.bench"]  # `python -m analysis.targets`
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]]  # fmt: skip


def test_no_import_circle():
    graph = project_graph()
    found = circles(graph)
    lines = []
    for component in found:
        members = set(component)
        lines.append(" <-> ".join(component))
        for module in component:
            lines += [f"    {module} imports {target} (line {line})"
                      for target, line in sorted(graph[module].items()) if target in members]
    assert not found, "import circles:\n" + "\n".join(lines)


def test_each_layer_imports_only_itself_and_below():
    """kernels import nothing of the harness, the harness nothing of the analysis or the
    launchers; the analysis and the launchers sit on the harness."""
    graph = project_graph()
    upward = []
    for module, targets in graph.items():
        layer = LAYERS.get(module.partition(".")[0])
        for target, line in targets.items():
            above = LAYERS.get(target.partition(".")[0])
            if layer is not None and above is not None and above > layer:
                upward.append(f"{module} imports {target} (line {line})")
            elif layer == above == 2 and module.partition(".")[0] != target.partition(".")[0]:
                upward.append(f"{module} imports {target} (line {line}): a sibling layer")
    assert not upward, "\n".join(upward)
