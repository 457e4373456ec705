"""The standard sections of every report: configuration, data and training, metrics, test samples.

They come through the same ``taskformer_report_sections`` hook that task plugins use, first
because this plugin is marked ``tryfirst``.
"""
from __future__ import annotations

from dataclasses import asdict

from rich.text import Text

from taskformer import hookimpl
from taskformer.core.clock import BUSY_SHARE
from taskformer.core.data import is_blank, is_pair
from taskformer.core.options import applies
from taskformer.plugins.sections import fmt, metric_list, simple_table


@hookimpl(tryfirst=True)
def taskformer_report_sections(run):
    from taskformer import Label  # torch: loaded by a run, not by listing tasks

    cfg = simple_table("section", "settings")
    sections = {**vars(run.config), "model": run.model.cfg}  # as built: vocabulary and classes filled in
    for section, values in sections.items():  # the options that apply to this kind of model (a tagger has no beam)
        cfg.add_row(section, ", ".join(f"{k}={v}" for k, v in asdict(values).items()
                                       if applies(type(values), k, run.task.variant)))

    info = run.info
    facts = simple_table("", "")
    facts.show_header = False
    rows = [("parameters", info.get("parameters")), ("vocabulary", info.get("vocab_size")),
            *((f"{s} examples", n) for s, n in info.get("data", {}).items()),
            *((f"{s} inputs truncated", n) for s, n in info.get("truncated", {}).items() if n),
            *info.get("notes", {}).items(),
            ("device", info.get("device")), ("precision", info.get("precision")),
            ("decode engine", info.get("engine")), ("threads", info.get("threads")),
            ("distilled from", distilled_from(info.get("distill"))),
            ("recipe", info["recipe"].get("why") if isinstance(info.get("recipe"), dict) else None),
            ("validations", info["recipe"].get("validating") if isinstance(info.get("recipe"), dict) else None),
            *(("budget warning", info["recipe"].get(key)) for key in ("busy", "short", "few")
              if isinstance(info.get("recipe"), dict)),
            ("training and validation", f"{info.get('train_seconds', 0):,.1f} s"),
            ("wall time (all)", f"{info.get('wall_seconds', 0):,.1f} s"
             + (f" of the {info['time_limit_seconds'] / 60:g} min time limit" if info.get("time_limit_seconds") else "")),
            *clock_rows(info.get("clock")),
            ("steps", info.get("steps")),
            ("epochs", info.get("epochs")), ("throughput", f"{info.get('tokens_per_s', 0):,} target tokens/s"),
            ("best step", info.get("best_step")),
            ("weights kept", info.get("kept_weights")), ("stopped", info.get("stopped")),
            ("resumed", resumed_at(info.get("resumed")))]
    for k, v in rows:
        if v is not None:
            facts.add_row(k, fmt(v))

    metrics = metric_list(run.metrics, run.task.metric, run.task.metric_groups)

    samples = simple_table("source", "output", "reference", show_lines=True)
    for src, prediction, ref in run.samples.get("test", []):
        right = (prediction.label if isinstance(prediction, Label) else prediction) == ref
        samples.add_row("\n".join(src) if is_pair(src) else src,  # a pair's texts one above the other
                        Text(str(prediction), style="green" if right else "yellow"), ref)

    # a language model's text has no source
    decoded = any(not is_blank(src) for src, _, _ in run.samples.get("test", []))
    return [("Configuration", cfg), ("Data and training", facts),
            (f"Metrics (selected by {run.task.metric})", metrics), *([("Test samples", samples)] if decoded else [])]


def resumed_at(record) -> str | None:
    """Where an interrupted run went on from, each time, and why it had stopped (None if it never did)."""
    said = [f"after update {fmt(r.get('step'))} (it had stopped: {r.get('after')})"
            for r in record if isinstance(r, dict)] if isinstance(record, list) else []
    return "; ".join(said) or None


def clock_rows(record) -> list[tuple[str, str | None]]:
    """The pace before training and over the run, the share of the time limit used, why it is short
    of the limit where it is, and the threads' changes: a busy machine shows here."""
    if not isinstance(record, dict):
        return []
    start, run, used, share = (record.get(k) for k in ("start_pace", "run_pace", "used", "start_share"))
    was_busy = isinstance(share, (int, float)) and share < BUSY_SHARE
    busy = f" (the machine was busy: this process had {share:.0%} of its cores' time)" if was_busy else ""
    return [("pace", f"{fmt(start)} target tokens/s before training{busy}, {fmt(run)} over the run" if start else None),
            ("time limit used", f"{used:.0%}" if isinstance(used, (int, float)) else None),
            ("why not all of it", record.get("short_of_limit")), ("why over it", record.get("over_limit")),
            ("threads changed", thread_changes(record.get("threads")))]


def thread_changes(record) -> str | None:
    """Each change of torch's threads as the machine got busy and free again (None if none was made)."""
    said = [f"{fmt(c.get('from'))} to {fmt(c.get('to'))} at step {fmt(c.get('step'))} (other processes used "
            f"{fmt(c.get('others'))} of {fmt(c.get('cores'))} cores)"
            for c in record if isinstance(c, dict)] if isinstance(record, list) else []
    return "; ".join(said) or None


def distilled_from(record) -> str | None:
    """A distilled student's teacher and training data in words (None for any other run)."""
    if not isinstance(record, dict):
        return None
    search, members = record.get("teacher_search"), record.get("teacher_members")
    search = search if isinstance(search, dict) else {}
    beam = search.get("beam")
    how = [f"{members} members" if isinstance(members, int) and members > 1 else "one network",
           *([f"beam {beam}" if beam != 1 else "greedy"] if beam is not None else [])]
    if search.get("strategy") == "sample":
        how.append(f"sampled at temperature {fmt(search.get('temperature'))}, top-k {fmt(search.get('top_k'))}, "
                   f"top-p {fmt(search.get('top_p'))}, seed {fmt(search.get('seed'))}")
    if search.get("quantize") not in (None, "none"):
        how.append(f"{search['quantize']} weights")
    mixed = ", with the references" if record.get("mix") is True else ""
    outputs = "label distributions" if search.get("strategy") == "distribution" else "outputs"
    return (f"{record.get('teacher')} ({', '.join(how)}): its {outputs} for the "
            f"{fmt(record.get('count'))} train sources, in {record.get('file')}{mixed}")
