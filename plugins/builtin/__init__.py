"""The built-in plugins that declare no task: they hear every task (see the dispatch rule in hookspecs).

``defaults`` decodes for tasks without a decoder of their own; ``report_sections`` writes the
standard sections of every report; ``tensorboard`` is the tracker of ``train.tensorboard=true``.
Built-in *tasks* live in ``tasks/``.
"""
