"""The plugin API: hook specifications (``hookspecs``), the plugin manager that dispatches them
(``manager``), the reference generator (``docs``), what report sections are made of (``sections``)
and the built-in plugins that hear every task (``builtin``). Plugin authors import from
``taskformer`` itself.
"""
from taskformer.plugins.hookspecs import Task, hookimpl

__all__ = ["Task", "hookimpl"]
