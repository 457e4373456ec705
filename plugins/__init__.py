"""The plugin system: hook specifications, plugin manager, CLI and reports.

Plugin authors import what they need from here::

    from taskformer.plugins import Task, hookimpl
"""
from .hookspecs import Task, hookimpl

__all__ = ["Task", "hookimpl"]
