"""taskformer: one shared Transformer core driven by task plugins.

Everything a task plugin needs is importable from here, so a plugin starts with one import::

    from taskformer import Task, TaskData, hookimpl, search, symbols

The code lives in the top-level folders of the source tree: ``core/`` (the model, search, training
engine and data plumbing, installed as ``taskformer.core``), ``plugins/`` (the plugin API: hook
specifications, the plugin manager and the built-in cross-cutting plugins, ``taskformer.plugins``)
and ``tasks/`` (the built-in task plugins, ``taskformer.tasks``); the application -- command line,
runner, reports, multi-process launcher, plugin scaffold -- is ``taskformer.app``, here, on top of
them (docs/architecture.md).
"""
__version__ = "0.1.0"

import importlib

from taskformer.core.config import RunConfig
from taskformer.core.data import TaskData, encode_sources, encode_words, find_file, read_lines, read_parallel, read_tsv
from taskformer.core.decoding import (Attention, Constraint, DecodeConfig, Label, beam_search, best_labels, best_tags,
                                      classify, greedy, max_lengths, search, tag_scores)
from taskformer.core.errors import DataError, TaskformerError
from taskformer.core.metrics import span_scores, translation_metrics
from taskformer.core.options import option
from taskformer.core.model import BOS, EOS, PAD, UNK, ClassificationHead, Generator, ModelConfig, TaggingHead
from taskformer.core.progress import stage, track
from taskformer.core.tokenize import CJK, SPECIALS, characters, subword, symbols
from taskformer.plugins.hookspecs import Output, Task, hookimpl
from taskformer.plugins.sections import cross_attention, save_figure

# The application sits on top of the plugin API: a plugin's ``from taskformer import hookimpl`` must
# not load it, so these names are imported on first use.
_APPLICATION = {"Model": "taskformer.api", "load": "taskformer.api", "Run": "taskformer.app.runner"}


def __getattr__(name: str):
    if name in _APPLICATION:
        return getattr(importlib.import_module(_APPLICATION[name]), name)
    raise AttributeError(f"module 'taskformer' has no attribute {name!r}")


__all__ = [
    "Attention", "BOS", "CJK", "EOS", "PAD", "SPECIALS", "UNK", "ClassificationHead", "Constraint", "DataError", "DecodeConfig",
    "Generator", "Label", "Model", "ModelConfig", "Output", "Run", "RunConfig", "TaggingHead", "Task", "TaskData",
    "TaskformerError", "beam_search", "best_labels", "best_tags", "characters", "classify", "cross_attention",
    "encode_sources", "encode_words", "find_file", "greedy", "hookimpl", "load", "max_lengths", "option", "read_lines",
    "read_parallel", "read_tsv", "save_figure", "search", "span_scores", "stage", "subword", "symbols", "tag_scores", "track", "translation_metrics",
]
