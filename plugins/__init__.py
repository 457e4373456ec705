"""The plugin API: hook specifications (``hookspecs``), the plugin manager that dispatches them
(``manager``), the reference generator (``docs``) and the built-in plugins that hear every task
(``builtin``). Plugin authors import from ``taskformer`` itself; ``from taskformer.plugins import
Task, hookimpl`` keeps working for plugins written before.
"""
from .hookspecs import Task, hookimpl

__all__ = ["Task", "hookimpl"]
