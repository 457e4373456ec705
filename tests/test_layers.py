"""Dependencies point down (docs/architecture.md): the plugin API does not load the application."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's


def test_a_plugin_and_the_plugin_manager_load_without_the_application():
    """A plugin's one import, a task of its own, every built-in plugin and task: none of it imports
    ``taskformer.app``; the application's names are still there on first use."""
    script = textwrap.dedent("""
        import sys
        from taskformer import Task, TaskData, hookimpl, search, symbols

        @hookimpl
        def taskformer_tasks():
            return [Task("layers-demo", "a task of a plugin")]

        from taskformer.plugins.manager import Plugins
        manager = Plugins(entry_point_group=None)
        manager.pm.register(sys.modules[__name__], name="layers-demo")
        manager.refresh()
        assert "layers-demo" in manager.tasks and "copy" in manager.tasks, sorted(manager.tasks)
        loaded = sorted(m for m in sys.modules if m.startswith("taskformer.app") or m == "taskformer.api")
        assert not loaded, loaded
        import taskformer
        assert taskformer.load.__module__ == "taskformer.api" and taskformer.Run.__name__ == "Run"
        assert "taskformer.app.runner" in sys.modules
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_no_module_of_a_lower_layer_imports_a_higher_one():
    """Read, not run: an import under ``if TYPE_CHECKING`` or inside a function counts too."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    above = {"core": ("taskformer.plugins", "taskformer.tasks", "taskformer.app", "taskformer.api"),
             "plugins": ("taskformer.tasks", "taskformer.app", "taskformer.api"),
             "tasks": ("taskformer.app", "taskformer.api")}
    found = []
    for layer, higher in above.items():
        for path in sorted((root / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith(higher)]
    assert not found, found


HEAVY = ("torch", "sacrebleu", "pypinyin", "matplotlib", "datasets", "fastapi")  # seconds to import on a laptop


@pytest.mark.parametrize("args", [["tasks"], ["tasks", "--json"], ["--help"], ["run", "--help"], ["serve", "--help"]])
def test_listing_tasks_and_help_load_no_heavy_library(args):
    """The commands a newcomer types first start at once: no torch and no other heavy library is
    imported (``-X importtime`` lists every module imported), and every plugin is still listed."""
    result = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "taskformer.app.cli" in imported  # the listing is there: the check can see what was loaded
    assert not [m for m in imported if m.split(".")[0] in HEAVY], sorted(m for m in imported if m.split(".")[0] in HEAVY)
    if args == ["tasks", "--json"]:
        listed = {t["name"]: t["plugin"] for t in json.loads(result.stdout)["tasks"]}
        assert {"copy", "translate-de-en", "translate-en-zh", "agnews", "couplet"} <= set(listed)
        assert listed["reverse"] == "reverse"  # the entry-point plugin of examples/taskformer-reverse


def test_building_a_configuration_loads_no_torch():
    """The configuration's sections are plain dataclasses: building and checking a run's
    configuration (what ``taskformer config`` and a task's declaration need) imports no torch."""
    script = textwrap.dedent("""
        import sys
        from taskformer import Task
        from taskformer.core import config
        task = Task("demo", "a task of no plugin")
        cfg = config.merge(config.defaults(task), {"train": {"bf16": "on"}, "model": {"d_model": 64}}, "--set")
        assert config.build(task, cfg).train.bf16 == "on"
        assert "model.d_model" in {row["key"] for row in config.reference(task)}
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not loaded, loaded[:5]
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
