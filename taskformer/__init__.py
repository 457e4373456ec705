"""taskformer: one shared Transformer core driven by task plugins.

Everything a task plugin needs is importable from here, so a plugin starts with one import::

    from taskformer import Task, TaskData, hookimpl, search, symbols

and so is the Python API (``taskformer.load(run_dir).predict(...)``). The names are grouped below
by who needs them: plugin authors, API users, and both (the errors).

The code lives in the top-level folders of the source tree: ``core/`` (the model, search, training
engine and data plumbing, installed as ``taskformer.core``), ``plugins/`` (the plugin API: hook
specifications, the plugin manager and the built-in cross-cutting plugins, ``taskformer.plugins``)
and ``tasks/`` (the built-in task plugins, ``taskformer.tasks``); the application -- command line,
runner, reports, multi-process launcher, plugin scaffold -- is ``taskformer.app``, here, on top of
them (docs/architecture.md).
"""
__version__ = "0.1.0"

import importlib

# Every name is imported on first use (PEP 562), from the module that defines it: a plugin's
# ``from taskformer import Task, hookimpl`` loads only the plugin API, so ``taskformer tasks`` and
# ``--help`` start without torch, and the application is not loaded by a plugin at all.

# For plugin authors: a task's declaration and hooks, the run it receives, reading and encoding data,
# the searches and their constraints, metrics and report figures, the model's heads.
_PLUGIN_API = {
    "taskformer.plugins.hookspecs": ["Output", "Task", "hookimpl"],
    "taskformer.plugins.run": ["Run"],
    "taskformer.core.data": ["TaskData", "encode_sources", "encode_words"],
    "taskformer.core.files": ["find_file", "read_lines", "read_parallel", "read_tsv"],
    "taskformer.core.tokenize": ["BOS", "CJK", "EOS", "PAD", "SPECIALS", "UNK", "characters", "subword", "symbols"],
    "taskformer.core.decoding": ["Attention", "Constraint", "Label", "beam_search", "best_labels", "best_tags",
                                 "classify", "greedy", "max_lengths", "sample", "search", "tag_scores"],
    "taskformer.core.metrics": ["rouge_scores", "span_scores", "translation_metrics"],
    "taskformer.core.model": ["ClassificationHead", "Generator", "TaggingHead"],
    "taskformer.core.model_config": ["ModelConfig"],
    "taskformer.core.options": ["option"],
    "taskformer.core.progress": ["stage", "track"],
    "taskformer.plugins.sections": ["cross_attention", "save_figure"],
}
# For users of the Python API: load a trained run and predict with it, and its settings.
_PYTHON_API = {
    "taskformer.api": ["Model", "load"],
    "taskformer.core.config": ["RunConfig"],
    "taskformer.core.decode_config": ["DecodeConfig"],
}
# For both: what a failure raises.
_ERRORS = {"taskformer.core.errors": ["DataError", "TaskformerError"]}
_MODULES = {**_PLUGIN_API, **_PYTHON_API, **_ERRORS}
_HOME = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'taskformer' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_HOME[name]), name)  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = sorted(_HOME)
