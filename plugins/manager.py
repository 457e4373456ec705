"""The plugin manager: built-in plugins plus everything installed under the ``taskformer`` entry-point group.

A plugin that fails to import, raises while declaring its tasks, or declares something that is
not a :class:`Task` is recorded in :attr:`Plugins.broken` with its name and reason; every other
plugin keeps working.

Per-task dispatch (the rule is stated for plugin authors in :mod:`.hookspecs`): a hook that takes a
``task`` goes to the plugin that declared the task and to the plugins that declare no task, never to
another task's plugin. pluggy does the selecting, with ``subset_hook_caller``.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from dataclasses import replace
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

import pluggy

from taskformer.core.errors import TaskformerError
from taskformer.plugins import hookspecs
from taskformer.plugins.hookspecs import Task

BUILTIN = [
    "taskformer.plugins.builtin.defaults",
    "taskformer.plugins.builtin.report_sections",
    "taskformer.plugins.builtin.tensorboard",
    "taskformer.tasks.copy",
    "taskformer.tasks.translate",
    "taskformer.tasks.translate_en_zh",
    "taskformer.tasks.agnews",
    "taskformer.tasks.couplet",
    "taskformer.tasks.shakespeare",
    "taskformer.tasks.classify",
    "taskformer.tasks.seq2seq",
    "taskformer.tasks.lm",
    "taskformer.tasks.tag",
]


class PluginError(TaskformerError):
    """A plugin misbehaved; the message names it."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class Plugins:
    """Loads plugins once and answers which tasks exist, who provides them, and what their hooks say."""

    def __init__(self, builtin: list[str] = BUILTIN, entry_point_group: str | None = "taskformer"):
        self.pm = pluggy.PluginManager("taskformer")
        self.pm.add_hookspecs(hookspecs)
        self.broken: dict[str, str] = {}
        for module in builtin:
            self._register(module, lambda m=module: importlib.import_module(m))
        if entry_point_group:
            for ep in entry_points(group=entry_point_group):
                self._register(ep.name, ep.load)
        self.refresh()

    def _register(self, name: str, load) -> None:
        try:
            self.pm.register(load(), name=name)
        except Exception as e:  # a broken plugin must not take the others down
            self.broken[name] = f"failed to load ({_one_line(e)})"

    def refresh(self) -> None:
        """Ask every plugin for its tasks again (after ``self.pm.register``/``unregister``)."""
        self.tasks: dict[str, Task] = {}
        self._listeners: dict[tuple[str, str], list[tuple[str, pluggy.HookCaller]]] = {}
        impls = self.pm.hook.taskformer_tasks.get_hookimpls()
        self.task_plugins = {impl.plugin_name for impl in impls}  # they hear only their own tasks
        for impl in reversed(impls):  # registration order
            name = impl.plugin_name
            try:
                declared = impl.function()
                if not isinstance(declared, (list, tuple)) or not all(isinstance(t, Task) for t in declared):
                    raise TypeError(f"taskformer_tasks must return a list of Task, got {declared!r:.80}")
            except Exception as e:
                self.broken[name] = f"taskformer_tasks raised {_one_line(e)}"
                continue
            for task in declared:
                if task.name in self.tasks:
                    self.broken[name] = f"task {task.name!r} is already provided by {self.tasks[task.name].plugin}"
                    continue
                self.tasks[task.name] = replace(task, plugin=name)

    def task(self, name: str) -> Task:
        if name in self.tasks:
            return self.tasks[name]
        broken = [p for p in self.broken if name in p]
        if broken:
            raise PluginError(f"task {name!r} is unavailable: plugin {broken[0]!r} {self.broken[broken[0]]}")
        close = difflib.get_close_matches(name, self.tasks, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"installed tasks: {', '.join(sorted(self.tasks))}"
        raise TaskformerError(f"unknown task {name!r}; {hint}")

    def listeners(self, hook: str, task: Task) -> list[tuple[str, pluggy.HookCaller]]:
        """The plugins that hear ``hook`` for ``task``, in pluggy's call order, each with a caller of its own.

        Calling plugin by plugin (each through a subset caller that reaches it alone) is what lets an
        error or a wrong answer name the plugin that gave it.
        """
        key = (hook, task.plugin)
        if key not in self._listeners:
            everyone = self.pm.get_plugins()
            others = [self.pm.get_plugin(name) for name in self.task_plugins - {task.plugin}]
            hearing = self.pm.subset_hook_caller(hook, remove_plugins=others).get_hookimpls()
            self._listeners[key] = [(impl.plugin_name, self.pm.subset_hook_caller(hook, everyone - {impl.plugin}))
                                    for impl in reversed(hearing)]
        return self._listeners[key]

    def answers(self, hook: str, task: Task, **kwargs) -> Iterator[tuple[str, Any]]:
        """``(plugin name, answer)`` from each plugin that hears ``hook`` for ``task`` and does not answer
        ``None``, lazily: for a first-result hook, take the first. An exception from a plugin becomes a
        one-line :class:`PluginError` naming it."""
        collect = not getattr(self.pm.hook, hook).spec.opts.get("firstresult")
        for name, caller in self.listeners(hook, task):
            try:
                answer = caller(task=task, **kwargs)
            except TaskformerError:
                raise
            except Exception as e:
                raise PluginError(f"plugin {name!r} failed in {hook} for task {task.name!r}: {_one_line(e)}") from e
            if collect:  # a collecting hook gives a list of the non-None results: here of one plugin
                answer = answer[0] if answer else None
            if answer is not None:
                yield name, answer

    def first(self, hook: str, task: Task, **kwargs) -> tuple[str, Any]:
        """The first answer to a first-result hook, as ``(plugin name, answer)``; ``("", None)`` if none."""
        return next(self.answers(hook, task, **kwargs), ("", None))


@lru_cache(maxsize=1)
def plugins() -> Plugins:
    return Plugins()
