"""taskformer: one shared Transformer core driven by task plugins.

The code lives in the top-level folders ``core/``, ``plugins/`` and ``tasks/`` of the source tree,
installed as ``taskformer.core``, ``taskformer.plugins`` and ``taskformer.tasks``.
"""
__version__ = "0.1.0"
