"""The application around the core and the plugins: the ``taskformer`` command line (``cli``), the
glue that trains, evaluates and predicts through the hooks (``runner``), report rendering
(``report``), the multi-process launcher (``distributed``) and the plugin scaffold (``scaffold``)."""
from __future__ import annotations

import importlib


class lazy:  # noqa: N801 -- used like the module it stands for
    """Stands for the module ``name``, imported when the first attribute is looked up on it.

    The command line names the modules of every command but imports only those of the command it
    runs, so ``taskformer tasks`` and ``--help`` start without loading torch. The stand-in is not a
    module and never enters ``sys.modules`` (importlib's ``LazyLoader`` puts one there, and code
    that walks ``sys.modules``, as torch's import does, then loads it half-way through another import).
    """

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
