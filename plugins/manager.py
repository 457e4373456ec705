"""The plugin manager: built-in plugins plus everything installed under the ``taskformer`` entry-point group.

A plugin that fails to import, raises while declaring its tasks, or declares something that is
not a :class:`Task` is recorded in :attr:`Plugins.broken` with its name and reason; every other
plugin keeps working.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import replace
from functools import lru_cache
from importlib.metadata import entry_points

import pluggy

from ..core.errors import TaskformerError
from . import hookspecs
from .hookspecs import Task

BUILTIN = [
    "taskformer.plugins.defaults",
    "taskformer.plugins.report",
    "taskformer.tasks.copy",
    "taskformer.tasks.translate",
    "taskformer.tasks.agnews",
    "taskformer.tasks.couplet",
]


class PluginError(TaskformerError):
    """A plugin misbehaved; the message names it."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class Plugins:
    """Loads plugins once and answers which tasks exist and who provides them."""

    def __init__(self, builtin: list[str] = BUILTIN, entry_point_group: str | None = "taskformer"):
        self.pm = pluggy.PluginManager("taskformer")
        self.pm.add_hookspecs(hookspecs)
        self.broken: dict[str, str] = {}
        for module in builtin:
            self._register(module, lambda m=module: importlib.import_module(m))
        if entry_point_group:
            for ep in entry_points(group=entry_point_group):
                self._register(ep.name, ep.load)
        self.tasks = self._collect_tasks()

    def _register(self, name: str, load) -> None:
        try:
            self.pm.register(load(), name=name)
        except Exception as e:  # a broken plugin must not take the others down
            self.broken[name] = f"failed to load ({_one_line(e)})"

    def _collect_tasks(self) -> dict[str, Task]:
        tasks: dict[str, Task] = {}
        for impl in reversed(self.pm.hook.taskformer_tasks.get_hookimpls()):  # registration order
            name = impl.plugin_name
            try:
                declared = impl.function()
                if not isinstance(declared, (list, tuple)) or not all(isinstance(t, Task) for t in declared):
                    raise TypeError(f"taskformer_tasks must return a list of Task, got {declared!r:.80}")
            except Exception as e:
                self.broken[name] = f"taskformer_tasks raised {_one_line(e)}"
                continue
            for task in declared:
                if task.name in tasks:
                    self.broken[name] = f"task {task.name!r} is already provided by {tasks[task.name].plugin}"
                    continue
                tasks[task.name] = replace(task, plugin=name)
        return tasks

    def task(self, name: str) -> Task:
        if name in self.tasks:
            return self.tasks[name]
        broken = [p for p in self.broken if name in p]
        if broken:
            raise PluginError(f"task {name!r} is unavailable: plugin {broken[0]!r} {self.broken[broken[0]]}")
        close = difflib.get_close_matches(name, self.tasks, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"installed tasks: {', '.join(sorted(self.tasks))}"
        raise TaskformerError(f"unknown task {name!r}; {hint}")

    def call(self, hook: str, task: Task, **kwargs):
        """Call a hook for ``task``; an exception from a plugin becomes a one-line error naming it."""
        try:
            return getattr(self.pm.hook, hook)(task=task, **kwargs)
        except TaskformerError:
            raise
        except Exception as e:
            raise PluginError(f"plugin {task.plugin!r} failed in {hook} for task {task.name!r}: {_one_line(e)}") from e


@lru_cache(maxsize=1)
def plugins() -> Plugins:
    return Plugins()
