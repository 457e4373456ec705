"""``taskformer run TASK --dry-run``: check data, config, memory and ``--out``, and say what would
run, training nothing.

It is the run's own :func:`~taskformer.app.prepare.prepare` -- the merged config, the data hook
(data, tokenizer, labels), the memory and ``--out`` checks, under a time limit the probe and the
plan of the time -- then the model with the plugin's head and the updates the trainer plans, so
whatever would stop a run at its start stops the dry run the same way; no run directory is written.
"""
from __future__ import annotations

from taskformer.app import datacache, hooks
from taskformer.app.prepare import TrainRequest, prepare
from taskformer.core.engine import epoch_updates, planned_updates
from taskformer.plugins.manager import plugins
from taskformer.plugins.sections import count


def dry_run(task_name: str, data_dir: str | None = None, config_file: str | None = None,
            overrides: tuple[str, ...] = (), seed: int | None = None, time_limit: float | None = None,
            out: str | None = None, nproc: int = 1) -> dict:
    """What ``taskformer run`` would do with these arguments, as a dict (see :func:`describe`)."""
    task = plugins().task(task_name)
    prepared = prepare(TrainRequest(task, data_dir, out, time_limit, seed, config_file, tuple(overrides), nproc=nproc))
    config, data, recipe = prepared.config, prepared.data, prepared.recipe
    model = hooks.build_model(task, config, data.tokenizer.get_vocab_size(), data.labels, training=True)
    train = datacache.encoded(data, "train", config.model.max_len, task.variant)
    per_epoch = len(epoch_updates(config.train, train.lengths()))
    m = config.model
    return {
        "task": task.name, "plugin": task.plugin, "variant": task.variant, "metric": task.metric,
        "model": {"d_model": m.d_model, "n_heads": m.n_heads, "enc_layers": m.enc_layers if m.kind.encoder else 0,
                  "dec_layers": m.dec_layers if m.kind.decoder else 0, "d_ff": m.d_ff,
                  "max_len": m.max_len, "members": m.members, "parameters": model.num_parameters()},
        "vocab_size": data.tokenizer.get_vocab_size(), "labels": len(data.labels or []),
        "data": {split: len(rows) for split, rows in data.splits.items()},
        "notes": {k: v for k, v in data.notes.items() if isinstance(v, (str, int, float))},
        "truncated_train_inputs": train.truncated,
        "budget": {"epochs": config.train.epochs, "max_steps": config.train.max_steps,
                   "time_limit_minutes": time_limit, "updates_per_epoch": per_epoch,
                   "planned_updates": planned_updates(config.train, per_epoch)
                   or (recipe["planned_updates"] if recipe else 0),
                   "warmup": config.train.warmup, "patience": config.train.patience},
        "recipe": recipe,
    }


def describe(plan: dict) -> str:
    """The plan as lines for a person: what would be trained, on what, for how long."""
    m, b = plan["model"], plan["budget"]
    layers = "+".join(str(n) for n in (m["enc_layers"], m["dec_layers"]) if n) + " layers"
    budget = [f"{count(b['epochs'], 'epoch')} of {count(b['updates_per_epoch'], 'update')}" if b["epochs"]
              else f"no epoch cap (epochs of {count(b['updates_per_epoch'], 'update')})"]
    if b["max_steps"]:
        budget.append(f"at most {count(b['max_steps'], 'update')} (train.max_steps)")
    if b["time_limit_minutes"]:
        budget.append(f"at most {b['time_limit_minutes']:g} minutes for the whole run, its final evaluation "
                      "included (--time-limit: fewer updates on a busier machine)")
    if b["patience"]:
        budget.append(f"stop after {b['patience']} evaluations without improvement (train.patience)")
    planned = (f"planned {count(b['planned_updates'], 'update')}, the first {b['warmup']:,} warming up"
               if b["planned_updates"] else "updates: as many as the time allows")
    recipe = plan["recipe"]
    lines = [
        f"task: {plan['task']} ({plan['variant']}, plugin {plan['plugin']}; best checkpoint by {plan['metric']})",
        f"model: d_model {m['d_model']}, {m['n_heads']} heads, {layers}, d_ff {m['d_ff']}, max_len {m['max_len']}"
        + (f", {m['members']} members" if m["members"] > 1 else "") + f": {m['parameters']:,} parameters",
        f"vocabulary: {plan['vocab_size']:,} tokens" + (f", {plan['labels']} labels" if plan["labels"] else ""),
        "data: " + ", ".join(f"{split} {n:,}" for split, n in plan["data"].items())
        + (f" ({plan['truncated_train_inputs']:,} train inputs longer than max_len)"
           if plan["truncated_train_inputs"] else ""),
        *(f"data notes: {key}: {value}" for key, value in plan["notes"].items()),
        f"budget: {'; '.join(budget)}; {planned}",
        *([f"recipe: {recipe['why']}",
           f"final evaluation: about {recipe['final_seconds']:,.0f} s (measured), kept out of the training time",
           *([f"validating: {recipe['validating']}"] if recipe.get("validating") else [])]
          if recipe else []),
        *(f"warning: {recipe[key]}" for key in ("busy", "short", "few") if recipe and recipe.get(key)),
        "dry run: config, data, memory and --out checked; nothing trained, no run directory written",
    ]
    return "\n".join(lines)
