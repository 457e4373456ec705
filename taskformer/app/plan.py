"""``taskformer run TASK --dry-run``: check data, config and memory, and say what would run, training nothing.

It goes through the same steps as a run up to the first update -- the merged config, the data hook
(data, tokenizer, labels), the memory check and the model with the plugin's head -- so whatever
would stop a run at its start stops the dry run the same way; no run directory is written.
"""
from __future__ import annotations

from taskformer.core.data import encode, token_batches
from taskformer.plugins.manager import plugins
from taskformer.app import hooks, resources, training


def dry_run(task_name: str, data_dir: str | None = None, config_file: str | None = None,
            overrides: tuple[str, ...] = (), seed: int | None = None, time_limit: float | None = None) -> dict:
    """What ``taskformer run`` would do with these arguments, as a dict (see :func:`describe`)."""
    task = plugins().task(task_name)
    config = training.make_config(task, config_file, list(overrides), seed, time_limit)
    training.check_budget(config, time_limit)
    footprint = getattr(config.data, "footprint", None)
    if footprint:
        resources.check_memory(task, config, **footprint())
    data = hooks.load_data(task, config, data_dir)
    recipe = None
    if time_limit:  # the recipe the run would pick (measuring the pace takes a few seconds unless train.pace is set)
        resources.use_threads(config)
        recipe = training.pick_recipe(task, config, data, time_limit, resources.pick_device())
        config = training.with_recipe(task, config_file, overrides, seed, time_limit, recipe)
    model = hooks.build_model(task, config, data.tokenizer.get_vocab_size(), data.labels, training=True)
    train = encode(data, "train", config.model.max_len, task.variant)
    per_epoch = max(len(token_batches(train.lengths(), config.train.max_tokens)) // config.train.accumulate, 1)
    # 0: no epoch cap and no step limit, the time limit decides
    planned = min((n for n in (per_epoch * config.train.epochs, config.train.max_steps) if n), default=0)
    m = config.model
    return {
        "task": task.name, "plugin": task.plugin, "variant": task.variant, "metric": task.metric,
        "model": {"d_model": m.d_model, "n_heads": m.n_heads, "enc_layers": m.enc_layers,
                  "dec_layers": m.dec_layers if m.kind.decoder else 0, "d_ff": m.d_ff,
                  "max_len": m.max_len, "members": m.members, "parameters": model.num_parameters()},
        "vocab_size": data.tokenizer.get_vocab_size(), "labels": len(data.labels or []),
        "data": {split: len(rows) for split, rows in data.splits.items()},
        "truncated_train_inputs": train.truncated,
        "budget": {"epochs": config.train.epochs, "max_steps": config.train.max_steps,
                   "time_limit_minutes": time_limit, "updates_per_epoch": per_epoch,
                   "planned_updates": planned, "patience": config.train.patience},
        "recipe": recipe,
    }


def describe(plan: dict) -> str:
    """The plan as lines for a person: what would be trained, on what, for how long."""
    m, b = plan["model"], plan["budget"]
    layers = f"{m['enc_layers']}+{m['dec_layers']} layers" if m["dec_layers"] else f"{m['enc_layers']} layers"
    budget = [f"{b['epochs']} epochs of {b['updates_per_epoch']:,} updates" if b["epochs"]
              else f"no epoch cap (epochs of {b['updates_per_epoch']:,} updates)"]
    if b["max_steps"]:
        budget.append(f"at most {b['max_steps']:,} updates (train.max_steps)")
    if b["time_limit_minutes"]:
        budget.append(f"at most {b['time_limit_minutes']:g} minutes (--time-limit: fewer updates on a busier machine)")
    if b["patience"]:
        budget.append(f"stop after {b['patience']} evaluations without improvement (train.patience)")
    planned = f"planned {b['planned_updates']:,} updates" if b["planned_updates"] else "updates: as many as the time allows"
    lines = [
        f"task: {plan['task']} ({plan['variant']}, plugin {plan['plugin']}; best checkpoint by {plan['metric']})",
        f"model: d_model {m['d_model']}, {m['n_heads']} heads, {layers}, d_ff {m['d_ff']}, max_len {m['max_len']}"
        + (f", {m['members']} members" if m["members"] > 1 else "") + f": {m['parameters']:,} parameters",
        f"vocabulary: {plan['vocab_size']:,} tokens" + (f", {plan['labels']} labels" if plan["labels"] else ""),
        "data: " + ", ".join(f"{split} {n:,}" for split, n in plan["data"].items())
        + (f" ({plan['truncated_train_inputs']:,} train inputs longer than max_len)"
           if plan["truncated_train_inputs"] else ""),
        f"budget: {'; '.join(budget)}; {planned}",
        *([f"recipe: {plan['recipe']['why']}"] if plan["recipe"] else []),
        "dry run: config, data and memory checked; nothing trained, no run directory written",
    ]
    return "\n".join(lines)
