"""The package's layers, read from its source (no import runs): every package has a rank in
one table (RANKS), no module imports one of a higher rank, and no import circle joins two
modules or two packages (type-only imports count: a circle there is a circle a reader must
untangle). The repository's `targets/` is read too (installed as `infinity_cloud.targets`),
and a string naming a module of the package counts as an import of it: registries import
their entries so (`targets/registry.py`, `backends/registry.py`)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from parsed_source import parsed

ROOT = Path(__file__).resolve().parents[2]
# Each folder read, with the name its modules are imported under once installed (setup.py).
SOURCES = {"infinity_cloud": ROOT / "infinity_cloud", "infinity_cloud.targets": ROOT / "targets"}

# Each folder of the package by rank (a layer is a folder: no module sits beside them but the
# package's own `__init__` and `__main__`): a module may import its own rank (with no circle) and
# lower ones, never a higher one.
# A module's rank is that of the longest name here that holds it.
RANKS: dict[str, int] = {
    # 0 the vocabulary every layer speaks (errors, capabilities, results, a model's facts, the
    #   spec, this machine); it imports nothing else here
    "infinity_cloud.core": 0,
    # 1 numerics the backends and the engine share (model inputs, pooling, heads, fidelity)
    "infinity_cloud.numerics": 1,
    # 2 backends run a graph on a device: graphs and numerics, never a task, family or request
    "infinity_cloud.backends": 2,
    # 3 engine parts that need no model: limits and memory budget, queue and batch worker,
    #   result cache, tokenizers
    "infinity_cloud.admission": 3,
    "infinity_cloud.batching": 3,
    "infinity_cloud.cache": 3,
    "infinity_cloud.text": 3,
    # 4 engine parts that turn a request's inputs into a model's: media, tasks, families
    "infinity_cloud.media": 4,
    "infinity_cloud.tasks": 4,
    "infinity_cloud.families": 4,
    # 5 one served model, assembled from the parts below and a backend
    "infinity_cloud.models": 5,
    # 6 the engine: what a caller asks of it in its own terms (asks.py), one admitted call run
    #   on a served model (pipeline.py), and the front door that answers each ask (front_door.py)
    "infinity_cloud.engine": 6,
    # 7 what runs on the engine: bulk jobs; the HTTP app's shared parts (errors, parsing, keys);
    # measuring a server over HTTP and sizing deployments from it (bench, plan)
    "infinity_cloud.bulk": 7,
    "infinity_cloud.sizing": 7,
    "infinity_cloud.server": 7,
    # 8 the HTTP routes: a module per wire dialect, the status routes (models, health, metrics)
    #   and the admin routes
    "infinity_cloud.server.dialects": 8,
    "infinity_cloud.server.status_routes": 8,
    "infinity_cloud.server.admin_routes": 8,
    # 9 the app factory, which mounts the routes on the shared parts
    "infinity_cloud.server.app": 9,
    # 10 what every target shares (base, images, the container's runtime, preflight checks)
    "infinity_cloud.targets": 10,
    # 11 the targets, a package each (one may build on another: kubernetes on local)
    "infinity_cloud.targets.local": 11,
    "infinity_cloud.targets.modal": 11,
    "infinity_cloud.targets.sagemaker": 11,
    "infinity_cloud.targets.aws_lambda": 11,
    "infinity_cloud.targets.kubernetes": 11,
    # 12 the target registry, which names every target
    "infinity_cloud.targets.registry": 12,
    # 13 the command line (with the admin API's client and Infinity's command line translated),
    #   and the package itself
    "infinity_cloud.cli": 13,
    "infinity_cloud.__main__": 13,
    "infinity_cloud": 13,
}

# A string that names a module (`package.module`, or `package.module:attribute`).
MODULE_PATH = re.compile(r"infinity_cloud(\.\w+)+(:\w+)?")


def module_name(path: Path, folder: Path, package: str) -> str:
    parts = path.relative_to(folder).with_suffix("").parts
    return ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def modules() -> dict[str, Path]:
    return {
        module_name(path, folder, package): path
        for package, folder in SOURCES.items()
        for path in folder.rglob("*.py")
    }


def packages(found: dict[str, Path]) -> set[str]:
    """Every folder holding modules (one without an `__init__.py` too)."""
    return {name if path.name == "__init__.py" else name.rpartition(".")[0] for name, path in found.items()}


def named(node: ast.AST, path: Path) -> list[str]:
    """What `node` imports: modules (and names in them) of an import statement, or the module
    a string names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):  # absolute only: the package has no relative ones
        assert node.level == 0, f"{path}: a relative import"
        base = node.module or ""
        return [f"{base}.{alias.name}" for alias in node.names] + [base]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.fullmatch(node.value):
        return [node.value.partition(":")[0]]
    return []


def imports() -> dict[str, set[str]]:
    """Each module, with the package's modules it imports, wherever in it. A package the
    module sits in is left out: Python imports it first, whatever the module says. (Read once
    per test run; each caller gets its own copy.)"""
    return {name: set(targets) for name, targets in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    found = modules()
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for node in ast.walk(parsed(path)):
            for target in named(node, path):
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
            if root_names(node, found):  # Python imports the root first, but not what it hands out
                graph[name].add("infinity_cloud")
    graph["infinity_cloud"].discard("infinity_cloud")
    return graph


def root_names(node: ast.AST, found: dict[str, Path]) -> list[str]:
    """The names other than submodules and the version that `node` takes from the package's
    root (`from infinity_cloud import Engine`): the root hands them out from the top layer."""
    if not isinstance(node, ast.ImportFrom) or node.module != "infinity_cloud":
        return []
    return [a.name for a in node.names if f"infinity_cloud.{a.name}" not in found]


def layer(module: str, ranks: dict[str, int]) -> str:
    """The name in `ranks` that holds `module`: itself, or its longest enclosing package."""
    name = module
    while name not in ranks:
        assert "." in name, f"{module} has no rank"
        name = name.rpartition(".")[0]
    return name


def between_layers(graph: dict[str, set[str]], ranks: dict[str, int]) -> dict[str, set[str]]:
    """The imports between the names in `ranks` (packages), read off those between modules."""
    joined: dict[str, set[str]] = {name: set() for name in ranks}
    for module, targets in graph.items():
        for target in targets:
            if layer(module, ranks) != layer(target, ranks):
                joined[layer(module, ranks)].add(layer(target, ranks))
    return joined


def upward(graph: dict[str, set[str]], ranks: dict[str, int]) -> list[str]:
    """Every import of a module of a higher rank than the importer's, as a line."""
    return [
        f"{module} (rank {ranks[layer(module, ranks)]}) imports {target} (rank {ranks[layer(target, ranks)]})"
        for module in sorted(graph)
        for target in sorted(graph[module])
        if ranks[layer(target, ranks)] > ranks[layer(module, ranks)]
    ]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_rank_of_its_own() -> None:
    found = modules()
    top = {name for name, path in found.items() if path.parent == SOURCES["infinity_cloud"]}
    needed = packages(found) | top
    assert sorted(needed - set(RANKS)) == []  # a new package: give it its rank here
    assert sorted(set(RANKS) - set(found)) == []  # a rank for what no longer exists


def test_a_layer_is_a_folder() -> None:
    """No module sits in `infinity_cloud/` beside the layers' folders but the package's own."""
    top = {path.name for path in SOURCES["infinity_cloud"].glob("*.py")}
    assert top == {"__init__.py", "__main__.py"}, "put a new module in the folder of its layer"


def test_no_module_imports_a_higher_rank() -> None:
    assert upward(imports(), RANKS) == []


def test_no_module_imports_itself_through_others() -> None:
    assert circles(imports()) == []


def test_no_package_imports_itself_through_others() -> None:
    assert circles(between_layers(imports(), RANKS)) == []


def test_registries_that_import_by_string_are_read() -> None:
    graph = imports()
    assert "infinity_cloud.targets.local.target" in graph["infinity_cloud.targets.registry"]
    assert "infinity_cloud.backends.torch_backend" in graph["infinity_cloud.backends.registry"]


def test_the_rank_check_finds_an_upward_import() -> None:
    ranks = {"low": 0, "low.part": 0, "high": 1}
    graph = {"low.part.a": {"high.b"}, "high.b": {"low.part.a"}, "low.c": set()}
    assert upward(graph, ranks) == ["low.part.a (rank 0) imports high.b (rank 1)"]
    assert circles(between_layers(graph, ranks)) == [["high", "low.part"]]


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_name_taken_from_the_root_counts_as_importing_the_root() -> None:
    """`from infinity_cloud import Engine` in a low module is an upward import, though Python
    imports the root package before any module: the root hands out the top layer's names."""
    found = modules()
    taken = ast.parse("from infinity_cloud import Engine, __version__, core\n").body[0]
    # the version too is the root's to hand out: a lower layer names core.version's
    assert root_names(taken, found) == ["Engine", "__version__"]
