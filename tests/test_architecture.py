"""One owner for the run directory (docs/architecture.md): read, not run, the package's source names
each file of a run only in ``taskformer/app/rundir.py``; every other module asks it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWNER = "taskformer/app/rundir.py"
RUN_FILES = ("config.json", "result.json", "metrics.jsonl", "tokenizer.json", "outputs-")
# A file of the same name that is no run's: the CTranslate2 export folder's tokenizer
ELSEWHERE = {("core/export.py", "tokenizer.json")}
# A string that is a path to one of them, alone or after a folder ("/config.json", f"outputs-{split}")
PATH = re.compile(r"^/?(" + "|".join(re.escape(name) for name in RUN_FILES) + ")")


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstrings' nodes: prose may name the files it is about."""
    owners = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return {id(o.body[0].value) for o in owners
            if o.body and isinstance(o.body[0], ast.Expr) and isinstance(o.body[0].value, ast.Constant)}


def run_file_paths(path: Path) -> list[str]:
    """Each string constant of ``path`` (f-strings' pieces included) that is a run file's path."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = docstrings(tree)
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in prose and PATH.match(node.value)]


def test_only_the_run_directory_module_names_the_run_files():
    sources = [p for folder in ("core", "plugins", "tasks", "taskformer") for p in sorted((ROOT / folder).rglob("*.py"))]
    assert ROOT / OWNER in sources
    found = [f"{p.relative_to(ROOT)}: {value!r}" for p in sources if str(p.relative_to(ROOT)) != OWNER
             for value in run_file_paths(p)
             if (str(p.relative_to(ROOT)), PATH.match(value)[1]) not in ELSEWHERE]
    assert not found, "ask taskformer.app.rundir instead:\n" + "\n".join(found)
    owned = {PATH.match(value)[1] for value in run_file_paths(ROOT / OWNER)}
    assert owned == set(RUN_FILES)  # the check sees the names where they are

