"""The package's layering, read from its source (nothing imported): no import circle, and the
simulator reached only by itself and the two composition roots."""

import ast
from pathlib import Path

import hostagent

PACKAGE = Path(hostagent.__file__).parent
# Where --simulate is wired in; everything else speaks to the simulator through
# hostagent.platform.
COMPOSITION_ROOTS = {"hostagent.cli.main", "hostagent.daemon.main"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


def _module_of(name: str) -> str:
    """The module a dotted name lives in (``hostagent.sim.store.SimStore`` -> its module)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str) -> set[str]:
    """The package's modules ``module`` imports, at the top or inside a function."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {_module_of(n) for n in names if n.split(".")[0] == "hostagent"}
    out.discard(module)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def _circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_at_the_top_inside_functions_and_relative_ones():
    assert "hostagent.hostroot" in GRAPH["hostagent.devices.reader"]             # from ..hostroot import
    assert "hostagent.sim.platform" in GRAPH["hostagent.cli.main"]               # inside a function
    assert "hostagent.runtime.crio" in GRAPH["hostagent.runtime.configure"]      # from . import crio
    assert "hostagent.devices" in GRAPH["hostagent.daemon.views"]                # a package


def test_no_import_circles():
    assert _circles() == [], "modules that import each other (split them so data flows one way)"


def _simulator(module: str) -> bool:
    return module == "hostagent.sim" or module.startswith("hostagent.sim.")


def test_only_the_composition_roots_reach_the_simulator():
    reaching = sorted(m for m, targets in GRAPH.items()
                      if not _simulator(m) and m not in COMPOSITION_ROOTS and any(map(_simulator, targets)))
    assert reaching == [], "production code imports the simulator: plug it in through hostagent.platform"


def _imports_nvml(module: str) -> bool:
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pynvml" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "pynvml":
            return True
    return False


def _reached(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += GRAPH[module]
    return seen


def test_the_kubelet_plugins_read_the_node_only_through_the_agents_api():
    nvml = {m for m in MODULES if _imports_nvml(m)}
    assert "hostagent.devices.reader" in nvml                  # the check sees NVML's users
    for plugin in ("hostagent.cli.dra_plugin", "hostagent.plugins.dra.plugin", "hostagent.cli.device_plugin",
                   "hostagent.plugins.deviceplugin"):
        assert plugin in MODULES, plugin
        assert sorted(_reached(plugin) & nvml) == [], f"{plugin} reaches NVML"


# The actors the daemon composes: they sit below it, and what they share with it lives below
# them all (hostagent.faults, hostagent.mig.plan), never in the daemon's package.
ACTORS = ("driver", "sharing", "mig", "cdi", "runtime", "health", "labels", "metrics", "topology", "vfio")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_actors_never_reach_up_into_the_daemon():
    reaching = sorted(f"{m} -> {t}" for m, targets in GRAPH.items()
                      if any(_in(m, f"hostagent.{a}") for a in ACTORS)
                      for t in targets if _in(t, "hostagent.daemon"))
    assert reaching == [], "an actor imports the daemon's package: move what they share below both"
