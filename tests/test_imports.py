"""The repository's import graph, read with ast (nothing is imported): no cycles; kernels/ never imports the model
(layers.model) or the engine; bench/ and tests/ never import each other.

An edge is an explicit import of one of the repository's modules, at module level or inside a function:
`import a.b` and `from a.b import c` give a.b, or a.b.c where c is itself a module; relative imports resolve
against the importing module's package. `pkg/__init__.py` is the module `pkg`. The parent package that Python
initialises before a submodule is not an edge: `pkg.sub -> pkg` only counts when written out, as
`from pkg import name`."""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("kernels", "layers", "engine", "graphs", "bench", "tests", "tools")
SCRIPTS = ("run.py", "capture.py")
# (importer, imported, why): a module under the first prefix may not import one under the second
RULES = (("kernels", "layers.model", "kernels/ never imports the model"),
         ("kernels", "engine", "kernels/ never imports the engine"),
         ("bench", "tests", "bench/ and tests/ are siblings"),
         ("tests", "bench", "bench/ and tests/ are siblings"))


def modules(root: str, packages=PACKAGES, scripts=SCRIPTS) -> dict:
    """{dotted module name: path} of every .py file under `packages` and of the top-level `scripts`."""
    found = {os.path.splitext(s)[0]: os.path.join(root, s) for s in scripts if os.path.exists(os.path.join(root, s))}
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            parts = os.path.relpath(folder, root).split(os.sep)
            for f in sorted(files):
                if f.endswith(".py"):
                    found[".".join(parts if f == "__init__.py" else parts + [f[:-3]])] = os.path.join(folder, f)
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _known(name: str, known) -> str | None:
    """The longest prefix of `name` that is a repository module (None: not ours, e.g. torch)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def imports(name: str, path: str, known) -> set:
    """The repository modules that module `name` (its source at `path`) imports explicitly."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            # `from a import b`: the module a.b where b is one, else a (b a name defined in a)
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        found.update(t for t in map(lambda t: _known(t, known), targets) if t is not None)
    found.discard(name)
    return found


def import_graph(root: str = REPO, packages=PACKAGES, scripts=SCRIPTS) -> dict:
    """{module: set of the repository modules it imports} for the whole tree under `root`."""
    known = modules(root, packages, scripts)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict) -> list:
    """One cycle [a, b, ..., a] for each group of modules that import each other (a strongly connected component
    of more than one module), sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(v):                                 # Tarjan's algorithm, an explicit stack for deep graphs
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        group.add(w)
                        if w == node:
                            break
                    if len(group) > 1:
                        groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for group in groups:                            # a shortest way back to the group's first module
        start = min(group)
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            nxt = sorted(w for w in graph[path[-1]] if w in group)
            if start in nxt:
                found.append(path + [start])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append(path + [w])
    return sorted(found)


def forbidden(graph: dict, rules=RULES) -> list:
    """"importer -> imported (why)" for every edge that breaks a rule, sorted."""
    return sorted(f"{a} -> {b} ({why})" for a, edges in graph.items() for b in edges
                  for src, dst, why in rules if _under(a, src) and _under(b, dst))


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_kernels_do_not_import_the_model_or_the_engine():
    found = [f for f in forbidden(import_graph()) if f.startswith("kernels")]
    assert not found, "\n".join(found)


def test_bench_and_tests_do_not_import_each_other():
    found = [f for f in forbidden(import_graph()) if f.startswith(("bench", "tests"))]
    assert not found, "\n".join(found)


def test_the_graph_covers_the_repository():
    graph = import_graph()
    assert {"run", "capture", "kernels", "kernels.device", "tests.test_imports", "tools.aot_compile"} <= set(graph)
    assert "layers.config" in graph["run"] and "kernels.device" in graph["tests.conftest"]


def write_tree(root, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_flag_a_synthetic_tree(tmp_path):
    """The same functions, on a small tree with every kind of edge: cycles through absolute, relative and
    in-function imports, and imports the rules forbid."""
    write_tree(tmp_path, {
        "run.py": "import kernels.a\n",
        "kernels/__init__.py": "",
        "kernels/a.py": "import torch\nfrom kernels import b\n\ndef f():\n    import layers.model\n",
        "kernels/b.py": "from .a import x\nfrom engine.core import y\n",
        "kernels/ok.py": "from layers.quant import Weight\nfrom layers import config\n",
        "kernels/pkg/__init__.py": "from . import sub\nfrom kernels.pkg.other import z\n",
        "kernels/pkg/sub.py": "from .other import z\n",             # its parent package: not an edge
        "kernels/pkg/other.py": "from .. import ok\n",
        "kernels/bad/__init__.py": "from kernels.bad.gemv import g\n",
        "kernels/bad/gemv.py": "from kernels.bad import CONSTANT\n",   # written out: a cycle
        "layers/__init__.py": "", "layers/model.py": "", "layers/quant.py": "", "layers/config.py": "",
        "engine/__init__.py": "", "engine/core.py": "import kernels.ok\n",
        "bench/__init__.py": "", "bench/suite.py": "def main():\n    from tests.test_x import CASES\n",
        "tests/test_x.py": "import bench.suite\nfrom tests import helpers\n", "tests/helpers.py": "",
    })
    graph = import_graph(str(tmp_path))
    assert graph["kernels.a"] == {"kernels.b", "layers.model"}
    assert graph["kernels.b"] == {"kernels.a", "engine.core"}
    assert graph["kernels.ok"] == {"layers.quant", "layers.config"}
    assert graph["kernels.pkg"] == {"kernels.pkg.sub", "kernels.pkg.other"}
    assert graph["kernels.pkg.sub"] == {"kernels.pkg.other"} and graph["kernels.pkg.other"] == {"kernels.ok"}
    assert graph["tests.test_x"] == {"bench.suite", "tests.helpers"} and graph["run"] == {"kernels.a"}
    assert cycles(graph) == [["bench.suite", "tests.test_x", "bench.suite"],
                             ["kernels.a", "kernels.b", "kernels.a"],
                             ["kernels.bad", "kernels.bad.gemv", "kernels.bad"]]
    assert forbidden(graph) == ["bench.suite -> tests.test_x (bench/ and tests/ are siblings)",
                                "kernels.a -> layers.model (kernels/ never imports the model)",
                                "kernels.b -> engine.core (kernels/ never imports the engine)",
                                "tests.test_x -> bench.suite (bench/ and tests/ are siblings)"]
