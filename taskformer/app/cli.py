"""The ``taskformer`` command line: the surface every task shares.

User errors (bad names, files, config, checkpoints) print one ``Error:`` line and exit with
code 2; ``taskformer --debug ...`` shows the traceback instead.
"""
from __future__ import annotations

import io
import json
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click
from rich.console import Console
from rich.table import Table

from taskformer.app import scaffold, serve
from taskformer.core import progress
from taskformer.core.errors import TaskformerError
from taskformer.core.export import QUANTIZATIONS
from taskformer.plugins.manager import plugins
from taskformer.plugins.sections import metric_list, visible

if TYPE_CHECKING:
    from taskformer.app.prepare import TrainRequest

# Each command imports the modules it runs inside its function: most load torch, which `taskformer tasks`
# and --help do without.


class CLI(click.Group):
    """The command group; the commands of plugins (``taskformer_register_commands``) join it when a
    command is first looked up, not when this module is imported."""

    plugin_commands_added = False

    def get_command(self, ctx, name):
        self._add_plugin_commands()
        return super().get_command(ctx, name)

    def list_commands(self, ctx):
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def _add_plugin_commands(self) -> None:
        if not self.plugin_commands_added:
            self.plugin_commands_added = True
            plugins().pm.hook.taskformer_register_commands(cli=self)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except TaskformerError as e:
            if ctx.params.get("debug"):
                raise
            code = getattr(e, "exit_code", 2)  # 130: stopped as asked (Ctrl-C), which is no error
            click.echo(f"{'' if code == 130 else 'Error: '}{visible(e)}", err=True)  # it may quote a file or a path
            ctx.exit(code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as e:  # a bug: still one line, unless --debug
            if ctx.params.get("debug"):
                raise
            click.echo(f"Error: internal error {type(e).__name__}: {visible(e)} (rerun with --debug for the traceback)",
                       err=True)
            ctx.exit(1)


@click.group(cls=CLI, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(package_name="taskformer")
def main(debug: bool) -> None:
    """Train, evaluate and run Transformer models for a task by name."""
    warnings.showwarning = _one_line_warning


def as_json_text(value, **options) -> str:
    """``value`` as JSON for a script, its text whole (not ASCII-escaped) but for the control characters
    JSON lets through raw (C1, bidirectional overrides), written as ``\\uXXXX``: the same value to a
    parser, nothing a terminal acts on."""
    return visible(json.dumps(value, ensure_ascii=False, **options), as_json=True)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Library warnings (e.g. an emulated bf16) reach the user as one stderr line, without source lines."""
    click.echo(f"warning: {visible(message)}", err=True)


def listing_console() -> Console:
    """The console for tables that scripts read (tasks, runs, metrics): the terminal's width on a
    terminal; in a pipe or a file as wide as the table needs, so no name or path is cut or wrapped."""
    console = Console()
    return console if console.is_terminal else Console(width=1 << 16)


@main.command("tasks")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the tasks (name, variant, metric, "
                                                        "description, plugin) and the plugins that failed to load.")
def tasks_cmd(as_json) -> None:
    """List installed tasks and the plugin that provides each."""
    p = plugins()
    tasks = sorted(p.tasks.values(), key=lambda t: t.name)
    if as_json:
        click.echo(as_json_text({"tasks": [{"name": t.name, "variant": t.variant, "metric": t.metric,
                                          "description": t.description, "plugin": t.plugin} for t in tasks],
                               "broken": p.broken}, indent=2))
        return
    table = Table(title="taskformer tasks")
    for col in ("task", "variant", "metric", "description", "plugin"):
        table.add_column(col)
    for t in tasks:
        table.add_row(t.name, t.variant, t.metric, t.description, t.plugin)
    for name in p.broken:
        table.add_row("[red]-", "", "", "[red]broken (see below)", name)
    listing_console().print(table)
    for name, why in p.broken.items():
        click.echo(f"warning: plugin {name!r} {why}", err=True)


@main.command("config")
@click.argument("task")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML or JSON config file.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override one config value.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: every option's key, type, default, value, "
                                                        "allowed range and help.")
def config_cmd(task, config_file, overrides, as_json) -> None:
    """Print TASK's merged config: every key with its type, default, value, allowed range and help.

    The text is a TOML file that --config reads back; docs/config.md lists the same for every task.
    """
    from taskformer.app.prepare import make_config
    from taskformer.core.config import as_toml, reference

    chosen = plugins().task(task)
    rows = reference(chosen, make_config(chosen, config_file, list(overrides), None))
    if as_json:
        click.echo(as_json_text({"task": chosen.name, "variant": chosen.variant, "options": rows}, indent=2))
    else:
        click.echo(f"# taskformer config {chosen.name} ({chosen.variant}): every option, its help and range\n")
        click.echo(as_toml(rows), nl=False)


@main.command("run")
@click.argument("task", required=False)
@click.option("--data", "--data-dir", "data_dir", type=click.Path(),
              help="The task's data: a file, a folder, or hub:NAME[:CONFIG] (docs/data.md; --data-dir is the same).")
@click.option("--out", type=click.Path(), help="Run directory to create (default runs/TASK/<time>).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True),
              help="Training budget in minutes: trains until the time is up (train.epochs caps it only if set; "
                   "train.patience, 10 unless set, ends it early) with the recipe this machine's pace buys "
                   "(fewer updates on a busier machine; train.max_steps is the same anywhere).")
@click.option("--seed", type=int, help="Random seed (overrides train.seed).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML or JSON config file.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override one config value (`taskformer config TASK` lists every key, its range and help).")
@click.option("--resume", type=click.Path(file_okay=False), help="Continue an interrupted run directory.")
@click.option("--nproc", type=click.IntRange(min=1), default=1, help="Training processes (DistributedDataParallel).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--dry-run", is_flag=True, help="Check data, config and memory and print what would run; train nothing "
                                                "and write no run directory.")
def run_cmd(task, data_dir, out, time_limit, seed, config_file, overrides, resume, nproc, quiet, dry_run) -> None:
    """Train TASK, evaluate the best checkpoint on val and test, and print the report."""
    from taskformer.app import distributed, outdir, plan, resources, rundir
    from taskformer.app.console import ProgressDisplay
    from taskformer.app.prepare import TrainRequest

    if not task and not resume:
        raise click.UsageError("give a TASK to run, or --resume RUN_DIR")
    resources.checked_processes(nproc)
    if dry_run:
        if resume:
            raise TaskformerError("--dry-run checks a new run; it cannot be given with --resume")
        with ProgressDisplay(quiet) as display, progress.listening(display):
            checked = plan.dry_run(task, data_dir, config_file, overrides, seed, time_limit, out, nproc)
        click.echo(plan.describe(checked))
        return
    if resume:
        alone_with_resume("a run", rundir.CONFIG, {"TASK": task, "--data": data_dir, "--out": out,
                                                 "--time-limit": time_limit, "--seed": seed,
                                                 "--config": config_file, "--set": overrides})
    request = TrainRequest(plugins().task(task) if task else None,  # an unknown name fails here, once
                           data_dir, out, time_limit, seed, config_file, overrides, resume,
                           started=resources.command_started(), nproc=nproc)
    if nproc > 1:
        if not out and not resume:
            request.out = str(outdir.default_run_dir(task))  # a TASK is given: --resume is not
        distributed.launch(nproc, train_and_report, request=request, quiet=quiet)
    else:
        train_and_report(request, quiet, shard=distributed.from_environment() or (0, 1))


def alone_with_resume(what: str, record: str, options: dict) -> None:
    """Refuse any of ``options`` given beside --resume, which continues ``what`` as its ``record`` file says."""
    if given := [name for name, value in options.items() if value not in (None, ())]:
        raise TaskformerError(f"--resume continues {what} with the settings saved in its {record}; "
                              f"{', '.join(given)} cannot be given with it")


def train_and_report(request: TrainRequest, quiet: bool, shard: tuple[int, int] = (0, 1)) -> None:
    """One rank's work: train with a progress display; rank 0 prints and saves the report."""
    from taskformer.app import report, training
    from taskformer.app.console import ProgressDisplay

    with ProgressDisplay(quiet or shard[0] != 0) as display:
        run = training.train(request, on_event=display, shard=shard)
    if shard[0] == 0:
        report.render(run)


@main.command("distill")
@click.argument("teacher", required=False)
@click.option("--teacher-set", "teacher_set", multiple=True, metavar="decode.KEY=VALUE",
              help="Change the teacher's search over the train sources (e.g. decode.beam=5, "
                   "decode.length_penalty=0.6; default its own).")
@click.option("--out", type=click.Path(), help="The student's run directory to create (default runs/TASK/<time>).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True),
              help="The student's training budget in minutes, as `run --time-limit`, counted from the end of "
                   "the teacher's decode.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="distill.mix=false, or one of the student's settings (its size and recipe; default the task's).")
@click.option("--seed", type=int, help="The student's random seed (default: the teacher's train.seed).")
@click.option("--data", "--data-dir", "data_dir", type=click.Path(),
              help="The task's data: a file, folder or hub:NAME (default: the teacher's; --data-dir is the same).")
@click.option("--resume", type=click.Path(file_okay=False),
              help="Continue an interrupted distillation: the decode where it stopped, then the student.")
@click.option("--quiet", is_flag=True, help="No progress display.")
def distill_cmd(teacher, data_dir, out, time_limit, seed, overrides, teacher_set, resume, quiet) -> None:
    """Train one network on TEACHER's outputs (knowledge distillation).

    TEACHER, a finished run (an ensemble, say), decodes its task's train sources with its own
    search, or, a classifier, gives its probability of every label for each; a student run of the
    same task then trains on those outputs beside the references (instead of them: --set
    distill.mix=false). The student is a normal run, which predict, eval, serve and
    export take; its result names the teacher and the distillation data.
    """
    from taskformer.app import distill, report, rundir
    from taskformer.app.console import ProgressDisplay

    if not teacher and not resume:
        raise click.UsageError("give a TEACHER run directory, or --resume RUN_DIR")
    if resume:
        alone_with_resume("a distillation", rundir.DISTILLATION, {"TEACHER": teacher, "--data": data_dir, "--out": out,
                                                             "--time-limit": time_limit, "--seed": seed,
                                                             "--set": overrides, "--teacher-set": teacher_set})
    request = distill.DistillRequest(teacher, data_dir, out, time_limit, seed, overrides, teacher_set, resume)
    with ProgressDisplay(quiet) as display:
        run = distill.distill(request, on_event=display)
    report.render(run)


@main.command("eval")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--split", type=click.Choice(["val", "test"]), multiple=True, help="Split(s) to evaluate (default both).")
@click.option("--data", "--data-dir", "data_dir", type=click.Path(),
              help="The data: a file, folder or hub:NAME (default: the one the run used; --data-dir is the same).")
@click.option("--set", "overrides", multiple=True, metavar="decode.KEY=VALUE", help="Override a decoding setting.")
@click.option("--average", type=click.IntRange(min=1), metavar="N",
              help="Evaluate the average of the last N evaluated checkpoints (kept by train.average_last) instead.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the metrics of each split and the weights.")
@click.option("--quiet", is_flag=True, help="No progress display.")
def eval_cmd(run_dir, split, data_dir, overrides, average, as_json, quiet) -> None:
    """Re-evaluate a saved run's best checkpoint, or the average of its last checkpoints."""
    from taskformer.app import hooks, runner
    from taskformer.app.console import ProgressDisplay

    run = runner.load(run_dir)
    runner.set_decoding(run, overrides, "eval --set")
    weights = runner.use_average(run, average) if average else run.info.get("kept_weights", "best")
    engine = hooks.engine_choice(run.task, run.model, run.config)  # an engine that cannot decode it: refused here
    with ProgressDisplay(quiet) as display, progress.listening(display):
        results = runner.evaluate_saved(run, split or ("val", "test"), data_dir)
    search = None if run.model.cfg.kind.classifies else runner.search_of(run, run.config)  # --set included
    if as_json:
        click.echo(as_json_text({"task": run.task.name, "run_dir": str(run.dir), "weights": weights,
                               "engine": engine.as_dict(), "search": search, "metrics": results},
                              indent=2))
        return
    click.echo(f"{run.task.name}: {run.dir}")  # a line of its own: a table title would wrap the path
    listing_console().print(metric_list(results, run.task.metric, run.task.metric_groups))
    click.echo(f"weights: {weights}")
    click.echo(f"engine: {engine}")
    if search:
        click.echo("search: " + ", ".join(f"{k}={v}" for k, v in search.items()))


@main.command("predict")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("text", nargs=-1)
@click.option("--beam", type=click.IntRange(min=1), help="Beam size (1 = greedy); a search: sampling is off.")
@click.option("--set", "overrides", multiple=True, metavar="decode.KEY=VALUE",
              help="Override a decoding setting (e.g. decode.quantize=int8).")
@click.option("--json", "as_json", is_flag=True, help="One JSON value per input line: the output string, "
              "{label, probability} for a classifier ({text, text_pair, label, probability} for pairs), "
              "[[word, tag], ...] for a tagger, {prompt, continuation, settings} for a language model.")
@click.option("--threads", type=click.IntRange(min=1), help="torch threads for decoding, at most the cores this "
              "process may use  [default: the run's train.threads, or torch's choice]")
@click.option("--quiet", is_flag=True, help="No progress display (predict shows none: its outputs are the lines on "
              "stdout; warnings still go to stderr). Accepted as every command that shows progress accepts it.")
def predict_cmd(run_dir, text, beam, overrides, as_json, threads, quiet) -> None:
    """Run a trained model on TEXT, or on each line of stdin (one output line per input line; with
    decode.samples=N, N lines).

    A tagger prints WORD<TAB>TAG per word, the words as given, and a blank line after each input.
    A task of sentence pairs reads FIRST<TAB>SECOND per input. A language model's continuation
    keeps its line breaks on a terminal, a blank line after each; piped, it stays one line (its
    line breaks as spaces), and --json gives it exactly.
    """
    from taskformer.app import hooks, resources, runner

    if sys.stdout is None:  # started with stdout closed (`>&-`): every output would be lost without a word
        raise TaskformerError("standard output is closed; predict has nowhere to write its outputs")
    if sys.stdin is None and not text:  # started with stdin closed (`<&-`): no lines will ever come
        raise TaskformerError("standard input is closed; give the inputs as TEXT arguments or pipe them in")
    run = runner.load(run_dir)
    if threads:  # after loading, which sets the run's train.threads
        import torch

        torch.set_num_threads(resources.checked_threads(threads))
    runner.set_decoding(run, overrides, "predict --set")
    config = runner.with_search(run.config, beam)
    tagger, pairs, cut, done = run.model.cfg.kind.per_word, run.model.cfg.pairs, 0, 0
    engine = hooks.engine_choice(run.task, run.model, config)  # an engine that cannot decode it: refused here
    settings = None if run.model.cfg.kind.encoder else runner.generation_settings(run, config)
    if as_json:  # the outputs stay one JSON value per line; which engine ran, and why, is a message
        click.echo(f"engine: {as_json_text(engine.as_dict())}", err=True)
    texts = [t.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for t in text]  # as stdin's lines
    terminal = sys.stdout.isatty()  # a model's text reaches a terminal with its control characters visible
    for i in (i for i, (t, clean) in enumerate(zip(text, texts), 1) if t != clean):
        click.echo(f"warning: TEXT argument {i} is not valid UTF-8; its undecodable bytes were replaced by U+FFFD",
                   err=True)
    try:
        for lines in [texts] if text else stdin_batches(config.decode.batch_size):
            inputs, refused = pair_inputs(lines, done, "TEXT argument" if text else "stdin line") if pairs \
                else (lines, None)
            done += len(lines)
            outputs, n = runner.predict(run, inputs, config)
            cut += n
            for line, out in zip(inputs, outputs):
                said = shown(line, out, tagger, as_json, settings, lines=terminal)
                click.echo(visible(said, as_json) if terminal else said)  # flushes: each reaches a pipe at once
            if refused:
                raise refused
    except BrokenPipeError:  # the reader went away (`| head -1`): stop quietly, like any pipe filter
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python exits
        sys.exit(141)  # what a shell reports for a filter ended by SIGPIPE
    except OSError as e:  # /dev/full, a file too large, a disk gone: the outputs are not where they should be
        raise TaskformerError(f"cannot write predict's outputs to standard output ({e.strerror or e})") from None
    if as_json and not run.model.cfg.kind.classifies:  # the search that ran, --set and --beam included
        click.echo(f"search: {as_json_text(runner.search_of(run, config))}", err=True)
    if cut:
        click.echo(f"warning: {cut} input(s) longer than the model's {run.model.cfg.max_len} positions were truncated",
                   err=True)


def pair_inputs(lines: list[str], before: int, what: str) -> tuple[list[tuple[str, str]], TaskformerError | None]:
    """A pair task's input lines as pairs, up to the first line that is not ``FIRST<TAB>SECOND``, and
    that line's error (``None`` if every line is a pair): the lines before it are still predicted, so
    a filter that stops there has given the output of every line it read. ``before`` lines came earlier."""
    from taskformer.app.runner import pair_from_line

    inputs = []
    for number, line in enumerate(lines, before + 1):
        try:
            inputs.append(pair_from_line(line, f"{what} {number}"))
        except TaskformerError as e:
            return inputs, e
    return inputs, None


def shown(line, out, tagger: bool, as_json: bool, settings: dict | None = None, lines: bool = False) -> str:
    """What predict prints for one input: one line, or a tagger's WORD<TAB>TAG lines and a blank line;
    for a language model (which has generation ``settings``), its continuation (with ``lines``, for
    a terminal, its line breaks kept and a blank line after it); for a pair of texts (``line`` a
    tuple), its label, and with ``as_json`` both texts beside it."""
    from taskformer.core.data import is_pair
    from taskformer.core.decoding import Label, word_tags

    if as_json and is_pair(line):
        return as_json_text({"text": line[0], "text_pair": line[1], **out._asdict()})
    if tagger:
        out = word_tags(line, out)
    if as_json and settings is not None:
        return as_json_text({"prompt": line, "continuation": out, "settings": settings})
    if as_json:
        return as_json_text(out._asdict() if isinstance(out, Label) else out)
    if tagger:
        return "".join(f"{word}\t{tag}\n" for word, tag in out)
    samples = out if isinstance(out, list) else [str(out)]  # decode.samples: one answer per sample
    if lines and settings is not None:
        return "\n\n".join(samples) + "\n"
    return "\n".join(sample.replace("\n", " ") for sample in samples)  # piped: an answer a line


def stdin_batches(size: int):
    """Lines of stdin as they arrive, in batches of at most ``size``.

    Whatever input is already there is decoded without waiting for the end of the stream, so a slow
    producer sees its outputs as it goes. Undecodable bytes become U+FFFD with a warning naming the
    line: every input line gets its output line.
    """
    pending, number = b"", 0
    while True:
        chunk = cast(io.BufferedReader, sys.stdin.buffer).read1(1 << 16)  # typed BinaryIO, which lacks read1
        *raw_lines, pending = (pending + chunk).split(b"\n")
        if not chunk and pending:  # the last line had no newline
            raw_lines, pending = raw_lines + [pending], b""
        texts = []
        for raw in raw_lines:
            number += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("utf-8", errors="replace")
                click.echo(f"warning: stdin line {number} is not valid UTF-8; its undecodable bytes were replaced "
                           "by U+FFFD", err=True)
            if number == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark is not input
            texts.append(line.rstrip("\r"))
        for start in range(0, len(texts), size):
            yield texts[start : start + size]
        if not chunk:
            return


@main.command("export")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--to", "target", type=click.Choice(["ctranslate2", "onnx"]), required=True,
              help="Format to write: ctranslate2 (encoder-decoder, decoder-only), onnx (encoder-only, tagging).")
@click.option("--quantization", default="float32", show_default=True, type=click.Choice(QUANTIZATIONS),
              help="Weight type of a CTranslate2 model (ONNX: float32).")
@click.option("--force", is_flag=True, help="Export even though the task decodes with its own (e.g. constrained) "
                                            "search, which CTranslate2 cannot run.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in OUT_DIR.")
def export_cmd(run_dir, out_dir, target, quantization, force, overwrite) -> None:
    """Write RUN_DIR's model to OUT_DIR for another inference engine (CTranslate2, ONNX Runtime), tokenizer beside it.

    Only the network and the plain greedy/beam search travel: a task whose plugin decodes by its
    own rules (couplet's form constraint) would give other outputs there, so it is refused unless
    --force. An ONNX model is checked against the run's logits before it is written. docs/export.md
    has the details.
    """
    from taskformer.app import runner

    if target == "onnx" and quantization != "float32":
        raise TaskformerError(f"--quantization {quantization}: an ONNX export is float32 (decode.engine=onnxruntime "
                              "with decode.quantize=int8 quantizes it for ONNX Runtime)")
    runner.export(runner.load(run_dir), out_dir, quantization, overwrite, force, target)
    if target == "onnx":
        click.echo(f"wrote {out_dir}: ONNX model (model.onnx: input src, output logits; checked against the run's "
                   f"logits), tokenizer.json, taskformer.json (load it with onnxruntime.InferenceSession)")
        return
    click.echo(f"wrote {out_dir}: CTranslate2 {quantization} model, tokenizer.json, taskformer.json "
               f"(load it with ctranslate2.Translator({str(out_dir)!r}))")


@main.command("runs")
@click.argument("root", default="runs", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON list of the runs (path, task, status, date, "
                                                        "wall_seconds, metric, metrics) instead of a table.")
def runs_cmd(root, as_json) -> None:
    """List past and unfinished runs under ROOT (default ./runs): task, status, date, wall time, main metric, path."""
    from taskformer.app import report, rundir

    if not Path(root).is_dir():
        raise TaskformerError(f"{root}: no such directory")
    runs = rundir.find_runs(Path(root))
    if as_json:
        click.echo(as_json_text(report.finite(runs), indent=2, allow_nan=False))
        return
    listing_console().print(report.list_runs(runs, Path(root)))


@main.command("report")
@click.argument("run_dir", type=click.Path(file_okay=False))
def report_cmd(run_dir) -> None:
    """Show a finished run's report again and rewrite its report.txt and report.html."""
    from taskformer.app import report, runner

    run = runner.load(run_dir)
    if not run.metrics:
        raise TaskformerError(f"{run_dir}: the run has not finished (no result.json); resume it first")
    report.render(run)


@main.command("new-task")
@click.argument("name")
@click.option("--dir", "target", type=click.Path(file_okay=False), help="Where to write the package (default ./taskformer-NAME).")
@click.option("--variant", type=click.Choice(list(scaffold.VARIANTS)), default="encoder-decoder", show_default=True,
              help="The kind of task: text to text, one class per input, one tag per input word, or a language "
                   "model that continues a prompt.")
@click.option("--pairs", is_flag=True, help="Each input is a pair of texts (with --variant encoder-only): a "
                                            "classifier of sentence pairs.")
def new_task_cmd(name, target, variant, pairs) -> None:
    """Write a complete, installable plugin package for a new task called NAME."""
    installed = plugins().tasks.get(name)
    if installed and installed.plugin != name:  # the scaffold's own package (entry point NAME) is no conflict
        raise TaskformerError(f"task {name!r} is already installed (plugin {installed.plugin}); a second plugin "
                              "for it would replace it, so choose another name")
    path = Path(target) if target else Path(scaffold.names(name)["package"])
    for written in scaffold.write(name, path, variant, pairs):
        click.echo(f"wrote {written}")
    click.echo(f"next: pip install -e {path} && taskformer run {name}")


main.add_command(serve.command)
