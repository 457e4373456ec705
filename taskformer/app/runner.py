"""A trained run: load it, predict, evaluate, average its checkpoints, export it.

Training is :mod:`taskformer.app.training`'s; the hook calls :mod:`taskformer.app.hooks`', the run
directory :mod:`taskformer.app.rundir`'s, the machine :mod:`taskformer.app.resources`'.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import Field, fields, replace
from functools import partial
from pathlib import Path

import torch

from taskformer.app import engines, hooks, training
from taskformer.app.hooks import build_model, decode_texts, evaluate_split, load_data, normalize
from taskformer.app.prepare import TrainRequest
from taskformer.app.resources import check_search_memory, pick_device, use_threads
from taskformer.app.rundir import (
    bound_files,
    config_path,
    load_run_weights,
    read_config,
    read_metrics,
    read_outputs,
    read_result,
    read_tokenizer,
)
from taskformer.app.training import saved_config
from taskformer.core import checkpoint as ckpt
from taskformer.core import config as C
from taskformer.core import decoding, inference
from taskformer.core import export as export_model
from taskformer.core.config import RunConfig
from taskformer.core.data import encode_sources
from taskformer.core.errors import DataError, TaskformerError
from taskformer.core.options import applies, unused
from taskformer.core.precision import autocast
from taskformer.plugins.manager import plugins
from taskformer.plugins.run import Run


def predict(run: Run, lines: list, config: RunConfig | None = None, return_attention: bool = False):
    """Predictions for raw input lines (normalized by the task first; a pair task's as ``(first, second)``)
    and how many were truncated.

    The command line, :meth:`taskformer.Model.predict` and ``taskformer serve`` all decode here. With
    ``return_attention`` (encoder-decoder runs) each prediction comes as ``(prediction, Attention)``,
    the attention ``None`` for a blank line. With ``decode.samples`` above 1 each prediction is a
    list of that many samples, sample ``k`` drawn with seed ``decode.seed + k`` (as that seed alone gives it).
    ``config`` is taken as checked (built by :func:`with_decoding` or a request's settings): a server
    pays for no second check a batch; the Python API checks a config changed by hand.
    """
    config = fit_search(config or run.config, run.model.cfg.vocab_size)
    if return_attention and not run.model.cfg.kind.shifted:
        raise TaskformerError(f"return_attention is for encoder-decoder models; task {run.task.name!r} is "
                              f"{run.task.variant}")
    samples = config.decode.samples
    if return_attention and samples > 1:
        raise TaskformerError(f"return_attention maps one output per input, not decode.samples={samples}")
    sources = normalize(run.task, lines, config)
    draws = [decode_texts(run.task, run.model, run.tokenizer, run.labels,
                          replace(config, decode=replace(config.decode, seed=config.decode.seed + k)) if k else config,
                          sources, purpose="predict") for k in range(samples)]
    outputs, cut = (draws[0] if samples == 1 else ([list(drawn) for drawn in zip(*(d[0] for d in draws))], draws[0][1]))
    if return_attention:
        with autocast(config.train.bf16, run.device):
            outputs = [(out, decoding.cross_attention_map(run.model, run.tokenizer, src, str(out)) if src.strip()
                        else None) for src, out in zip(sources, outputs)]
    return outputs, cut


def pair_from_line(line: str, where: str) -> tuple[str, str]:
    """A pair task's input line, ``FIRST<TAB>SECOND``, as its two texts; a blank line is a blank pair
    (its prediction is blank, as a blank line's is for any task). ``where`` names the line in an error."""
    if not line.strip():
        return "", ""
    texts = line.split("\t")
    if len(texts) != 2:
        found = "no TAB" if len(texts) == 1 else f"{len(texts) - 1} TABs"
        raise TaskformerError(f"{where}: this task reads a pair of texts per line, separated by one TAB "
                              f"(FIRST<TAB>SECOND); the line has {found}")
    return texts[0], texts[1]


def continue_prompt(run: Run, text: str, config: RunConfig, on_text) -> str:
    """A language model's continuation of ``text``, as :func:`predict` gives it, calling ``on_text(piece)``
    with the text each new token adds as soon as it is chosen (the server streams them); returns the
    continuation: from CTranslate2's generation callback where it decodes (``decode.engine``), else from
    an observer of our search. A search that keeps several hypotheses (beam) or a task's own decoder
    gives its text at the end, in one piece. ``on_text`` may raise to stop the search."""
    if config.decode.temperature == 0 and config.decode.strategy == "beam" and config.decode.beam > 1 \
            or hooks.own_decoder(run.task) or config.decode.samples > 1:
        out = predict(run, [text], config)[0][0]
        if isinstance(out, str):  # several samples come as their list, in the result
            on_text(out)
        return out
    ids, _ = encode_sources(run.tokenizer, normalize(run.task, [text], config), run.model.cfg.max_len, prompt=True)
    src = torch.tensor(ids, dtype=torch.long, device=run.device)
    shown, width = "", max(len(ids[0]), 1)  # an empty prompt starts from BOS (core/decoding.py)

    def show(written: str) -> None:
        nonlocal shown
        if written.startswith(shown) and len(written) > len(shown):
            on_text(written[len(shown):])
            shown = written

    choice = hooks.engine_choice(run.task, run.model, config)
    runtime = None if choice.engine == "torch" else engines.runtime(choice, run.model, run.tokenizer, config.decode)
    if runtime is not None and runtime.fits(ids, config.decode):  # CTranslate2's generation callback
        chosen: list[int] = []
        stopped: list[BaseException] = []

        def on_token(token: int) -> bool:  # True stops the search: the reader is gone
            chosen.append(token)
            try:
                show(run.tokenizer.decode(chosen))
            except BaseException as e:  # raised through the runtime's C++ it would be lost: kept, raised after
                stopped.append(e)
            return bool(stopped)

        out_ids = runtime.search(ids, config.decode, on_token)[0]
        if stopped:
            raise stopped[0]
    else:
        model = inference.for_decoding(run.model.eval(), config.decode.quantize, config.decode.compile)

        def emit(step, prefix, logprobs):  # an observer in the constraint's place: it changes nothing
            show(run.tokenizer.decode(prefix[0, width:].tolist()))
            return logprobs

        with autocast(config.train.bf16 if config.decode.quantize == "none" else False, run.device):
            out_ids = decoding.search(model, src, config.decode, emit)[0]
    out = run.tokenizer.decode(out_ids)
    show(out)
    return out


def with_search(config: RunConfig, beam: int | None = None, batch_size: int | None = None) -> RunConfig:
    """``config`` with another beam size (1 = greedy; a search, so sampling is off) or decoding batch
    size, as predict's options ask."""
    decode = config.decode
    if (beam := whole_number("beam", beam)) is not None:
        refuse_unused(type(decode), "beam", config.model.variant, "beam")
        decode = replace(decode, strategy="beam" if beam > 1 else "greedy", beam=beam, temperature=0.0)
    if (batch_size := whole_number("batch_size", batch_size)) is not None:
        decode = replace(decode, batch_size=batch_size)
    return replace(config, decode=decode)


SAMPLING = ("temperature", "top_k", "top_p", "seed")  # what shapes a sampled output


def search_of(run: Run, config: RunConfig) -> dict:
    """The search ``run`` decodes with under ``config`` (its own, changed by ``--set`` or ``--beam``), as a
    record names it: a sampling run's temperature, top-k, top-p and seed, a searching one's beam and
    length penalty, and the limits and weights that shape either."""
    d = config.decode
    how = ({"strategy": "sample", **{k: getattr(d, k) for k in SAMPLING}}
           if d.temperature > 0 else {"strategy": d.strategy, "beam": d.beam if d.strategy == "beam" else 1,
                                      "length_penalty": d.length_penalty})
    limits = {k: getattr(d, k) for k in ("max_len_a", "max_len_b", "max_new_tokens")
              if applies(type(d), k, run.task.variant)}  # the ones its variant reads
    return {**how, **limits, "quantize": d.quantize,
            **inference.compile_record(run.model, d.compile and run.model.cfg.kind.decoder)}


def generation_settings(run: Run, config: RunConfig) -> dict:
    """The decode settings that shaped a language model's continuation, and the engine that ran them:
    what ``predict --json`` and the server report beside it. Read from :func:`search_of`'s record, in
    fewer words: a search's strategy and width (a beam of one is greedy), or sampling's settings alone."""
    search, d = search_of(run, config), config.decode
    how = ({k: search[k] for k in SAMPLING} if search["strategy"] == "sample"
           else {"strategy": search["strategy"] if search["beam"] > 1 else "greedy", "beam": search["beam"]})
    extra = {**({"samples": d.samples} if d.samples > 1 else {}),
             **({"no_repeat_ngram": d.no_repeat_ngram} if d.no_repeat_ngram else {})}
    return {**how, **extra, "max_new_tokens": search["max_new_tokens"],
            "engine": hooks.engine_choice(run.task, run.model, config).engine}


def whole_number(name: str, value: object) -> int | None:
    """``value`` of a caller's option (the API's, the server's): unset (None) or a whole number of at least 1.
    ``True`` is not a number here, though Python counts it as 1."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise TaskformerError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


MEMORY_RECHECK_S = 1.0  # the same config's search memory is checked again after this long
_memory_checked: list = [None, 0.0]  # the config last checked, and when


def fit_search(config: RunConfig, vocab: int) -> RunConfig:
    """A beam wider than the vocabulary is cut to it, with a warning (its first step has no more distinct
    tokens to keep, and each wider row costs memory); a search whose cache cannot fit is refused.

    The memory is read once a second for the same config: reading it costs up to a twentieth of a
    millisecond, which a lone sentence's ``predict`` on CTranslate2 (a few) would pay on every call."""
    decode = config.decode
    if decode.strategy == "beam" and decode.beam > vocab:
        warnings.warn(f"beam {decode.beam} is wider than the vocabulary ({vocab} tokens); it was cut to {vocab}", stacklevel=2)
        config = replace(config, decode=replace(decode, beam=vocab))
    now = time.monotonic()
    if _memory_checked[0] is not config or now - _memory_checked[1] > MEMORY_RECHECK_S:
        check_search_memory(config)
        _memory_checked[:] = config, now
    return config


def set_decoding(run: Run, overrides: list[str], option: str) -> None:
    """Apply ``--set decode.KEY=VALUE`` to a loaded run's configuration; other sections are refused
    (``option`` names the command's option in the message, e.g. ``eval --set``)."""
    updates = C.parse_overrides(list(overrides))
    if other := sorted(f"{section}.{key}" for section in set(updates) - {"decode"} for key in updates[section]):
        raise TaskformerError(f"{option} changes decoding only, not {', '.join(other)}: use decode.KEY=VALUE")
    run.config = with_decoding(run, updates.get("decode", {}), option.split()[-1])


def with_decoding(run: Run, decode: dict, source: str) -> RunConfig:
    """The run's configuration with the ``decode`` settings changed, checked like any setting (an
    unknown key, an option its variant does not use or a value out of range is an error naming ``source``)."""
    for key in decode:
        refuse_unused(type(run.config.decode), key, run.task.variant, f"{source} decode.{key}")
    config = C.build(run.task, C.merge(run.config.to_dict(), {"decode": decode}, source,
                                       kinds=C.section_types(run.task)))
    return fit_search(config, run.model.cfg.vocab_size)


def refuse_unused(kind: type, name: str, variant: str, given: str) -> None:
    """Refuse option ``name`` of the decode dataclass ``kind`` where a model of ``variant`` has no use
    for it (a classifier's beam), instead of accepting it to no effect."""
    if why := unused(kind, name, variant):
        raise TaskformerError(f"{given}: {why}")


# Decode options that only the whole process sets (`serve --set`, `predict --set`): the decoding batch, its
# threads, its weights (an int8 copy, a compiled step, which would stall every other request for tens of
# seconds) and engine (a runtime loaded once), and the search of validations, which a request never runs.
PROCESS_WIDE = ("batch_size", "workers", "quantize", "compile", "engine", "eval_strategy")


def request_options(run: Run) -> dict[str, Field]:
    """The decode options one request (an HTTP request, a Python call) may set, by name: those the
    run's variant uses, the task's own ``decode_options`` included, but none of :data:`PROCESS_WIDE`."""
    kind = type(run.config.decode)
    return {f.name: f for f in fields(kind) if f.name not in PROCESS_WIDE and applies(kind, f.name, run.task.variant)}


class OptionError(TaskformerError):
    """A request's decode option that is refused; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def request_config(run: Run, settings: dict) -> RunConfig:
    """The run's configuration with one request's decode ``settings`` (JSON values) applied, each checked
    as ``--set decode.KEY=VALUE`` is; :class:`OptionError` names the first refused one. A whole number
    ``beam`` picks the search as ``predict --beam`` does (1: greedy)."""
    if not settings:  # most requests: the run's own settings, as they were checked when it loaded
        return run.config
    offered = request_options(run)
    for key, value in settings.items():
        if key in PROCESS_WIDE and hasattr(run.config.decode, key):
            raise OptionError(key, f"{key}: set for the whole process, not per request (serve --set decode.{key}=..., "
                                   "or predict --set)")
        if key not in offered:
            raise OptionError(key, f"{key}: not a decode option of task {run.task.name!r} ({run.task.variant}); "
                                   f"it takes {', '.join(offered) or 'none'}")
        default = getattr(run.config.decode, key)
        if isinstance(value, str) != isinstance(default, str):  # JSON has types: "3" is no beam size
            raise OptionError(key, f"{key}: expects {type(default).__name__}, got {value!r:.40}")
    try:  # together, as --set applies them (samples needs the temperature given beside it)
        config = with_search(with_decoding(run, {k: v for k, v in settings.items() if k != "beam"}, "request"),
                             settings.get("beam"))
        C.validate(config)  # a beam turns sampling off
        return config
    except TaskformerError as e:
        together = str(e).removeprefix("config: ").removeprefix("request: ")
    for key, value in settings.items():  # the first one refused on its own is named
        try:
            if key == "beam":  # a search's width, as predict --beam gives it (1: greedy)
                with_search(run.config, value)
            else:
                with_decoding(run, {key: value}, "request")
        except TaskformerError as e:
            raise OptionError(key, str(e).removeprefix("config: ").removeprefix("request: ")) from None
    raise OptionError(next(iter(settings)), together)  # each is allowed; a task's validate() refuses them together


def evaluate_saved(run: Run, splits, data_dir: str | Path | None = None) -> dict[str, dict]:
    """Metrics of a loaded run on each of ``splits``, reading the data the run was trained on by default."""
    unknown = [s for s in splits if s not in ("val", "test")]
    if unknown:
        raise TaskformerError(f"unknown split {unknown[0]!r}: evaluate val or test")
    given = data_dir is not None
    if not given:
        data_dir = read_config(run.dir).data_dir
    try:
        data = load_data(run.task, run.config, data_dir, splits, run.tokenizer)  # the splits scored, nothing more
    except DataError as e:  # most often the data moved since the run trained: say where to give it
        if given:
            raise
        where = f"the run's data folder {data_dir}" if data_dir else "the run's data (it had no --data-dir)"
        raise DataError(f"{e} ({where}; give the data with taskformer eval {run.dir} --data-dir DIR)") from None
    return {s: evaluate_split(run, data.splits[s], name=f"decoding {s}")[0] for s in splits}


def export(run: Run, out_dir: str | Path, quantization: str, overwrite: bool = False, force: bool = False,
           target: str = "ctranslate2") -> None:
    """Write the run's network for CTranslate2 (core/export.py) or ONNX (core/onnx_export.py), with a
    manifest of where it came from.

    Only the network and plain greedy or beam search travel: a task whose plugin decodes by its own
    rules (couplet's form constraint) would give other outputs there, so it is refused unless ``force``.
    """
    from taskformer.core import onnx_export

    (onnx_export if target == "onnx" else export_model).check_exportable(run.model)
    if hooks.own_decoder(run.task):
        why = (f"task {run.task.name!r} is decoded by its plugin's own search (taskformer_decode hook, e.g. a "
               f"constrained one); {'ONNX' if target == 'onnx' else 'CTranslate2'} runs the plain network, so its "
               "outputs would differ from `taskformer predict`")
        if not force:
            raise TaskformerError(f"{why}; pass --force to export the network anyway")
        warnings.warn(why, stacklevel=2)
    info = {"task": run.task.name, "run_dir": str(run.dir), "max_input_length": run.model.cfg.max_len,
            "decode": run.config.to_dict()["decode"]}
    try:
        if target == "onnx":
            onnx_export.to_onnx(run.model, run.tokenizer, out_dir, overwrite, {**info, "labels": run.labels})
        else:
            export_model.to_ctranslate2(run.model, run.tokenizer, out_dir, quantization, overwrite,
                                        {**info, "quantization": quantization})
    except export_model.ExportExists as e:
        raise TaskformerError(f"{e}; pass --overwrite to replace it") from None


def use_average(run: Run, n: int) -> str:
    """Load the mean of the run's last ``n`` evaluated weights into its model; returns what they are."""
    kept = ckpt.evaluated_weights(run.dir)
    if len(kept) < n:
        raise TaskformerError(f"{run.dir}: averaging the last {n} checkpoints needs their weights, but the run kept "
                              f"{len(kept)} (train.average_last={n} or more keeps them)")
    steps = list(kept)[-n:]
    ckpt.load_average(run.model, [kept[s] for s in steps])
    return ckpt.weights_name(steps)


def load(run_dir: str | Path) -> Run:
    """Load a finished (or in-progress) run for eval, predict and report."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TaskformerError(f"{run_dir}: no such run directory")
    if export_model.earlier_export(run_dir) is not None:  # its model.bin is CTranslate2's, not a pickle
        raise TaskformerError(f"{run_dir}: a CTranslate2 model written by taskformer export, not a run directory; "
                              "run it with CTranslate2 (docs/export.md), or give the run it was exported from")
    ckpt.refuse_pickles(run_dir)
    saved = read_config(run_dir)
    cfg = saved.config
    try:
        task = plugins().task(saved.task)
    except TaskformerError as e:  # a task no longer installed, or a damaged name
        raise type(e)(f"{config_path(run_dir)}: {e}") from None
    if str(cfg.get("train", {}).get("bf16")).lower() == "true":
        cfg["train"]["bf16"] = "auto"  # a forced bf16 was for training there; decoding here follows this hardware
    if cfg.get("model", {}).get("variant") != task.variant:
        raise TaskformerError(f"{config_path(run_dir)}: model.variant is {cfg.get('model', {}).get('variant')!r}, "
                              f"but task {task.name!r} is {task.variant}")
    config = saved_config(task, cfg, str(config_path(run_dir)))
    use_threads(config)
    stamp = bound_files(run_dir, saved)
    tokenizer = read_tokenizer(run_dir)
    model = build_model(task, config, tokenizer.get_vocab_size(), saved.labels).to(pick_device())
    load_run_weights(model, run_dir, stamp)
    model.eval()
    result = read_result(run_dir)
    if result and result.weights_sha256 and ckpt.sha256(run_dir / ckpt.WEIGHTS) != result.weights_sha256:
        raise TaskformerError(f"{run_dir / ckpt.WEIGHTS}: not the weights this run finished with (their SHA-256 "
                              "differs from the one result.json records)")
    run = Run(run_dir, task, config, tokenizer, saved.labels, model, read_history=partial(read_metrics, run_dir))
    if result:
        run.metrics, run.info = result.metrics, result.info
    run.outputs = read_outputs(run_dir, config.model.kind.classifies)
    return run


def train_task(task_name: str | None = None, on_event=lambda e: None, shard: tuple[int, int] = (0, 1), **request) -> Run:
    """:func:`taskformer.app.training.train` for Python callers: the task by name, the rest of the
    :class:`~taskformer.app.prepare.TrainRequest` as keywords."""
    task = plugins().task(task_name) if task_name else None
    return training.train(TrainRequest(task, **request), on_event, shard)
