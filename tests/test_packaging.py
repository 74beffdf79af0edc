"""environment.yml and pyproject.toml name the same requirements."""
import os
import re
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(ROOT, "environment.yml")) as f:
        env = yaml.safe_load(f)
    deps = env["dependencies"]
    assert "python=3.11" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    pip_reqs = {_norm(r) for r in pip if not r.startswith("-e")}
    extras = project["optional-dependencies"]
    wanted = {_norm(r) for r in project["dependencies"] + extras["tf"] + extras["workflow"] + extras["test"]}
    assert pip_reqs == wanted
    assert project["requires-python"].startswith(">=3.11")


def test_workflow_env_lists_the_runtime_requirements():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(ROOT, "workflow", "envs", "enspipe.yaml")) as f:
        env = yaml.safe_load(f)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    extras = project["optional-dependencies"]
    assert {_norm(r) for r in pip} == {_norm(r) for r in project["dependencies"] + extras["tf"] + extras["workflow"]}
    assert "python=3.11" in env["dependencies"] and "sysstat" in env["dependencies"]


def test_horovod_environment_is_the_run_requirements_at_tensorflow_2_15():
    """requirements-horovod.txt: enspipe run's requirements, TensorFlow pinned to the last version
    Horovod 0.28.1 builds against; environment-horovod.yml installs that file and sets the same
    Horovod build flags as .ci/horovod-venv."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(ROOT, "requirements-horovod.txt")) as f:
        reqs = [_norm(r) for r in f.read().splitlines() if r.strip() and not r.startswith("#")]
    names = {re.split(r"[<>=!~]", r)[0] for r in reqs}
    workflow_only = {"seaborn", "snakemake", "snakemake-executor-plugin-slurm"}
    run_names = {re.split(r"[<>=!~]", _norm(r))[0] for r in project["dependencies"]} - workflow_only
    assert run_names <= names and "tensorflow-cpu==2.15.1" in reqs and "cmake>=3.20" in reqs
    with open(os.path.join(ROOT, "environment-horovod.yml")) as f:
        env = yaml.safe_load(f)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip == ["-r requirements-horovod.txt"] and "python=3.11" in env["dependencies"]
    with open(os.path.join(ROOT, ".ci", "horovod-venv")) as f:
        script = f.read()
    for flag, value in env["variables"].items():
        assert f"{flag}={value}" in script, flag
    assert "horovod==0.28.1" in script


LAYERS = ("common", "measure", "data", "models", "plan", "exchange", "engine", "run", "serve", "api", "report", "commands")  # bottom to top


def test_packages_import_only_downward():
    """The folder tree is the architecture: a package imports only its own layer and those below
    (src/enspipe/<layer>/), cli.py sits on top; so there is no import circle between layers."""
    import ast
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[1] / "src" / "enspipe"
    rank = {name: i for i, name in enumerate(LAYERS)} | {"cli": len(LAYERS), "__main__": len(LAYERS) + 1}
    assert sorted(p.name for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()) == sorted(LAYERS)
    upward = []
    for path in src.rglob("*.py"):
        here = path.relative_to(src).parts[0].removesuffix(".py")
        if here == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("enspipe."):
                there = node.module.split(".")[1]
                if rank[there] > rank[here]:
                    upward.append(f"{path.relative_to(src)} imports {node.module}")
    assert not upward, upward


def _file_imports(src) -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports anywhere in its text: at
    the top, inside functions and under ``TYPE_CHECKING`` alike."""
    import ast

    modules = {".".join(("enspipe", *p.relative_to(src).with_suffix("").parts)).removesuffix(".__init__"): p
               for p in src.rglob("*.py")}
    edges = {m: set() for m in modules}
    for m, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("enspipe"):
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            edges[m] |= {t for t in names if t in modules and t != m}
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_two_files_import_each_other_in_a_circle():
    """Within a package too, files read from their own lower files upwards: no module reaches
    itself through imports, counting those inside functions and under TYPE_CHECKING."""
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[1] / "src" / "enspipe"
    assert _circles(_file_imports(src)) == []


def test_the_circle_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


# what a module keeps inside its functions rather than import at its top: frameworks that take seconds
# or start something (MPI_Init) when imported, protobuf, and the optional image libraries
HEAVY = {"tensorflow", "torch", "torchvision", "jax", "mpi4py", "horovod", "ray", "optuna", "lightning", "kornia",
         "cv2", "PIL", "matplotlib", "seaborn", "pandas", "scipy", "snakemake", "nvidia", "spdl", "simplejpeg", "google"}
# processes that start often and should import only what they use: the command line parsing its
# arguments, a trial's attach() and each pillow worker process
LEAN = ("enspipe.cli", "enspipe.api.attach", "enspipe.engine.worker")


def _top_level(src):
    """Every module's imports made when it is imported (its body, its classes' and its try/if
    blocks', not TYPE_CHECKING's): the package modules (with their parent packages) and the
    other top-level packages."""
    import ast

    modules = {".".join(("enspipe", *p.relative_to(src).with_suffix("").parts)).removesuffix(".__init__"): p
               for p in src.rglob("*.py")}
    edges, outside = {m: set() for m in modules}, {m: set() for m in modules}

    def walk(m, body):
        for n in body:
            if isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.unparse(n.test):
                walk(m, n.body + n.orelse)
            elif isinstance(n, ast.Try):
                walk(m, n.body + [s for h in n.handlers for s in h.body] + n.orelse + n.finalbody)
            elif isinstance(n, ast.ClassDef):
                walk(m, n.body)
            elif isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(n, "module", None) != "__future__":
                for t in _targets(n, modules):
                    (edges if t.startswith("enspipe") else outside)[m].add(t if t.startswith("enspipe")
                                                                            else t.split(".")[0])

    for m, path in modules.items():
        walk(m, ast.parse(path.read_text()).body)
        parts = m.split(".")
        edges[m] |= {".".join(parts[:i]) for i in range(1, len(parts))}
    for m in edges:
        edges[m] = {p for t in edges[m] for p in _with_parents(t) if p in modules and p != m}
    return modules, edges, outside


def _targets(node, modules) -> list[str]:
    import ast

    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _reach(edges, start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for t in edges[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_an_import_inside_a_function_is_there_for_a_reason():
    """An enspipe import inside a function (outside cli.py and commands/, which import a command's
    work when it runs) is optional (under a try or an if), or of a module whose import brings a
    heavy framework (:data:`HEAVY`) that its importer's does not, or of modules that one of the
    :data:`LEAN` processes would then import without using them. Any other goes at the top of its
    file."""
    import ast
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[1] / "src" / "enspipe"
    modules, edges, outside = _top_level(src)
    heavy = {m: {h for r in _reach(edges, m) for h in outside[r] & HEAVY} for m in modules}
    lean = [_reach(edges, e) for e in LEAN]
    movable = []
    for m, path in modules.items():
        if m in ("enspipe", "enspipe.cli") or m.startswith("enspipe.commands"):
            continue
        for f in ast.walk(ast.parse(path.read_text())):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in f.body:  # (one under a try or an if is not in the body itself)
                if not isinstance(n, (ast.Import, ast.ImportFrom)) or not (getattr(n, "module", None) or
                                                                            n.names[0].name).startswith("enspipe"):
                    continue
                brought = set().union(*(_reach(edges, t) for t in _targets(n, modules) if t in modules))
                if heavy[m] >= {h for r in brought for h in outside[r] & HEAVY} and all(
                        m not in closure or brought <= closure for closure in lean):
                    movable.append(f"{path.relative_to(src)}:{n.lineno} {ast.unparse(n)}")
    assert not movable, movable
