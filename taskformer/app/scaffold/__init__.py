"""``taskformer new-task``: write a complete, installable task plugin package from templates.

The package it writes for ``reverse`` is ``examples/taskformer-reverse`` (a test keeps them equal),
so the scaffold, the example and the tutorial in docs/plugins.md are one piece of code.
"""
from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path
from string import Template

from ...core.errors import TaskformerError

FILES = {"pyproject.toml.tmpl": "pyproject.toml", "README.md.tmpl": "README.md",
         "module.py.tmpl": "${module}.py", "test_module.py.tmpl": "tests/test_${module}.py"}


def names(task: str) -> dict[str, str]:
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", task):
        raise TaskformerError(f"task name {task!r}: use lower-case letters, digits and single hyphens, e.g. sort-digits")
    module = "taskformer_" + task.replace("-", "_")
    return {"task": task, "module": module, "package": "taskformer-" + task}


def write(task: str, target: Path) -> list[Path]:
    """Render the templates into ``target`` (which must not exist or be empty); returns the files written."""
    values = names(task)
    if target.exists() and any(target.iterdir()):
        raise TaskformerError(f"{target} already exists and is not empty")
    written = []
    for template, name in FILES.items():
        path = target / Template(name).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(files(__package__).joinpath(template).read_text(encoding="utf-8")).substitute(values),
                        encoding="utf-8")
        written.append(path)
    return written
