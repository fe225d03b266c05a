"""Imports point down: the core never imports the training, benchmark or command-line layers."""
import ast
from pathlib import Path

import peagle

ROOT = Path(peagle.__file__).parent
UPPER = ("peagle.train", "peagle.bench", "peagle.cli", "peagle.demo")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


def _is_upper(name: str) -> bool:
    return any(name == u or name.startswith(u + ".") for u in UPPER)


def test_core_modules_never_import_the_upper_layers():
    core = [p for p in ROOT.rglob("*.py") if not _is_upper(_module(p)) and _module(p) != "peagle.__main__"]
    assert len(core) > 20  # the walk found the package
    bad = {_module(p): sorted(n for n in _imports(p) if _is_upper(n)) for p in core}
    assert {m: names for m, names in bad.items() if names} == {}


def test_the_cycle_and_the_planners_form_no_circle():
    """cycle.py reads the planner protocol (planner.py) but no planner; no planner reads cycle.py."""
    cycle = _imports(ROOT / "cycle.py")
    planners = [ROOT / f for f in ("planner.py", "autok.py", "autotree.py")]
    assert not any(n.startswith(("peagle.autok", "peagle.autotree")) for n in cycle)
    assert not any(n.startswith("peagle.cycle") for p in planners for n in _imports(p))
