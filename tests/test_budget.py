"""With --time-limit the clock is the budget: no epoch cap unless one is set, a default patience, and a
recipe picked from the task's table by pace x time limit (the pace faked with train.pace: no test
here depends on the machine's speed)."""
import json
import random
import re
import shutil

import pytest
import torch

from conftest import DATA
from taskformer import Task, TaskData, hookimpl, symbols
from taskformer.core import budget
from taskformer.core.budget import TIME_LIMIT_PATIENCE
from taskformer.plugins.manager import plugins

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

SMALL = {"d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 64, "dropout": 0.0, "max_len": 16}


class Sorting:
    """A tiny task whose table changes the feed-forward width: 1 M target tokens buy d_ff 96, 10 M d_ff 128."""

    TASK = Task("budget-sort", "Sort five digits (a plugin with a recipe table)", metric="exact_match",
                defaults={"model": SMALL, "train": {"epochs": 3, "max_tokens": 256, "lr": 3e-3, "warmup": 2,
                                                    "threads": 1}, "decode": {"workers": 1}},
                recipes=((1e6, {"model": {"d_ff": 96}}, "a wider FFN"),
                         (10e6, {"model": {"d_ff": 128}, "train": {"lr": 2e-3}}, "wider still")))

    def __init__(self):
        self.widths = []  # d_ff of every network built, in order: the probe's first

    @hookimpl
    def taskformer_tasks(self):
        return [self.TASK]

    @hookimpl
    def taskformer_head(self, model_config):
        self.widths.append(model_config.d_ff)
        return None  # the core's own output layer

    @hookimpl
    def taskformer_data(self, config):
        rng = random.Random(config.train.seed)

        def pairs(n):
            rows = [[rng.choice("0123456789") for _ in range(5)] for _ in range(n)]
            return [(" ".join(row), " ".join(sorted(row))) for row in rows]

        return TaskData(tokenizer=symbols(list("0123456789")),
                        splits={"train": pairs(60), "val": pairs(8), "test": pairs(8)})

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        return {"exact_match": 100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references)}


@pytest.fixture
def plugin(register):
    return register(Sorting(), "budget-sort-plugin")


@pytest.fixture
def sorting(plugin):
    return "budget-sort"


def saved(out, name):
    return json.loads((out / name).read_text())


def paced_run(cli, task, out, pace):
    """Two updates of ``task`` under an hour's limit at a given pace: its output and recipe record."""
    result = cli("run", task, "--out", str(out), "--time-limit", "60", "--set", f"train.pace={pace}",
                 "--set", "train.max_steps=2")
    assert result.exit_code == 0, result.output
    return result, saved(out, "result.json")["info"]["recipe"]


def translate_plan(cli, *args):
    # model.members=1 keeps the plan independent of the ensembles the recipe asks for
    result = cli("run", "translate-de-en", "--data-dir", str(DATA / "multi30k"), "--dry-run", "--quiet",
                 "--set", "train.threads=1", "--set", "model.members=1", *args)
    assert result.exit_code == 0, result.output
    return result.stdout


# The time limit is the whole command's: the start and the final evaluation take a little of the hour.
@pytest.mark.parametrize("pace, picked", [(3000, r"the task's defaults: 3,000 tok/s \(train.pace\) × (59\.\d|60\.0) min "
                                                 r"of training = 1[01](\.\d)? M"),
                                          (6000, r"model.members=2: 6,000 tok/s \(train.pace\) × (59\.\d|60\.0) min "
                                                 r"of training = 2[12](\.\d)? M"),
                                          (10100, r"model.members=3: 10,100 tok/s \(train.pace\) × (59\.\d|60\.0) min "
                                                  r"of training = 3[56](\.\d)? M")])
def test_a_given_pace_picks_the_translation_recipe_its_budget_reaches(cli, pace, picked):
    out = translate_plan(cli, "--time-limit", "60", "--set", f"train.pace={pace}")
    [line] = [line for line in out.splitlines() if line.startswith("recipe: ")]
    assert re.match(f"recipe: {picked} target tokens, about [0-9,]+ updates", line), line
    assert ("overridden by your settings: model.members" in line) == (pace > 3000)
    assert "no epoch cap" in out and f"stop after {TIME_LIMIT_PATIENCE} evaluations" in out


def test_without_a_time_limit_there_is_no_recipe_and_the_epochs_stay(cli):
    out = translate_plan(cli, "--set", "train.pace=10100")
    assert not [line for line in out.splitlines() if line.startswith("recipe")]  # (a path may hold the word)
    assert "40 epochs of" in out and "stop after" not in out


def test_a_time_limited_run_records_its_recipe_and_why(cli, sorting, tmp_path):
    out = tmp_path / "run"
    result, recipe = paced_run(cli, sorting, out, 300)
    assert f"recipe: {recipe['why']}" in result.stderr  # said before training
    assert re.match(re.escape(f"model.d_ff=96: 300 tok/s (train.pace) × {recipe['train_seconds'] / 60:.1f} min ")
                    + r"of training = 1(\.\d+)? M target tokens, about ", recipe["why"]), recipe["why"]
    assert recipe["why"].endswith("updates (from 1 M: a wider FFN)")
    assert {k: recipe[k] for k in ("name", "overrides", "pace", "pace_source", "minimum_tokens")} == {
        "name": "model.d_ff=96", "overrides": {"model": {"d_ff": 96}}, "pace": 300, "pace_source": "train.pace",
        "minimum_tokens": 1_000_000}
    # the hour less the start and the time kept for the final evaluation, measured before training
    assert recipe["reserve_seconds"] >= recipe["final_seconds"] >= 0
    assert recipe["train_seconds"] + recipe["reserve_seconds"] <= 3600
    assert recipe["budget_tokens"] == pytest.approx(300 * recipe["train_seconds"], abs=300)
    config = saved(out, "config.json")
    assert config["recipe"] == recipe and config["config"]["model"]["d_ff"] == 96
    assert "recipe" in (report := (out / "report.txt").read_text()) and "model.d_ff=96: 300 tok/s (train.pace)" in report


def test_your_settings_override_the_recipe_and_it_says_so(cli, sorting, tmp_path):
    out = tmp_path / "run"
    result = cli("run", sorting, "--out", str(out), "--quiet", "--time-limit", "60", "--set", "train.pace=3000",
                 "--set", "train.max_steps=1", "--set", "model.d_ff=80")
    assert result.exit_code == 0, result.output
    config = saved(out, "config.json")
    assert config["config"]["model"]["d_ff"] == 80 and config["config"]["train"]["lr"] == 2e-3  # the rest applies
    recipe = saved(out, "result.json")["info"]["recipe"]
    assert recipe["name"] == "model.d_ff=128, train.lr=0.002" and recipe["overridden"] == ["model.d_ff"]
    assert recipe["why"].endswith("; overridden by your settings: model.d_ff")


def test_the_pace_is_measured_on_the_task_s_model_whatever_you_set_of_the_table(cli, plugin, sorting, tmp_path):
    # the table counts tokens of the task's model: your d_ff (a key it sets) must not change the probe
    out = tmp_path / "run"
    result = cli("run", sorting, "--out", str(out), "--quiet", "--time-limit", "60", "--set", "train.max_steps=1",
                 "--set", "model.d_ff=80")
    assert result.exit_code == 0, result.output
    recipe = saved(out, "result.json")["info"]["recipe"]
    assert recipe["pace_source"] == "measured"
    assert plugin.widths[0] == SMALL["d_ff"] and set(plugin.widths[1:]) == {80}
    assert recipe["overridden"] == ["model.d_ff"]  # whichever row the pace reached: each sets another width


def test_a_setting_of_yours_is_named_even_where_the_row_picked_leaves_it_at_the_default(cli):
    out = translate_plan(cli, "--time-limit", "60", "--set", "train.pace=3000", "--set", "model.members=4")
    [line] = [line for line in out.splitlines() if line.startswith("recipe: ")]
    # the row of one model; your four members make a quarter of its updates, so the warm-up is cut
    assert re.match(r"recipe: train.warmup=\d+, train.warmup_share=0.1: 3,000 tok/s", line) and "(from 6 M: one model" in line
    assert line.endswith("; overridden by your settings: model.members")


def test_a_malformed_recipe_table_is_refused_in_one_line_naming_its_plugin(cli, register, tmp_path):
    bad = Sorting()
    bad.TASK = Task("budget-bad", "A table with a section no recipe may set", metric="exact_match",
                    defaults=Sorting.TASK.defaults, recipes=((1e6, {"optim": {"beta": 0.9}}, "not a section"),))
    register(bad, "budget-bad-plugin")
    out = tmp_path / "run"
    result = cli("run", "budget-bad", "--out", str(out), "--quiet", "--time-limit", "60", "--set", "train.max_steps=1")
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert "plugin 'budget-bad-plugin', task 'budget-bad': each recipe is" in line


def test_without_a_time_limit_nothing_is_measured_and_the_task_recipe_stands(cli, sorting, tmp_path):
    out = tmp_path / "run"
    result = cli("run", sorting, "--out", str(out), "--set", "train.max_steps=1")
    assert result.exit_code == 0, result.output
    assert "pace" not in result.stderr and "recipe" not in result.stderr
    config = saved(out, "config.json")
    assert "recipe" not in config and "recipe" not in saved(out, "result.json")["info"]
    assert (config["config"]["model"]["d_ff"], config["config"]["train"]["epochs"]) == (64, 3)
    assert config["config"]["train"]["patience"] == 0


def test_the_time_limit_is_the_budget_unless_you_cap_the_epochs(cli, sorting, tmp_path):
    # lr 1e-30 leaves the weights as they are, so val never improves after the first evaluation
    still = ["--quiet", "--time-limit", "60", "--set", "train.pace=1", "--set", "train.lr=1e-30"]
    uncapped, capped = tmp_path / "uncapped", tmp_path / "capped"
    assert cli("run", sorting, "--out", str(uncapped), *still).exit_code == 0
    train = saved(uncapped, "config.json")["config"]["train"]
    assert (train["epochs"], train["patience"]) == (0, TIME_LIMIT_PATIENCE)  # no cap, the default patience
    info = saved(uncapped, "result.json")["info"]
    assert info["stopped"] == f"no improvement in {TIME_LIMIT_PATIENCE} evaluations (patience)"
    assert info["epochs"] == TIME_LIMIT_PATIENCE + 1 > Sorting.TASK.defaults["train"]["epochs"]

    assert cli("run", sorting, "--out", str(capped), *still, "--set", "train.epochs=2").exit_code == 0
    assert saved(capped, "config.json")["config"]["train"]["epochs"] == 2
    assert saved(capped, "result.json")["info"]["stopped"] == "completed all epochs"


def test_a_linear_schedule_with_no_epoch_cap_decays_over_the_time_left_after_warm_up(cli, tmp_path):
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--quiet", "--time-limit", "60", "--set", "data.train_size=40",
                 "--set", "data.val_size=4", "--set", "data.test_size=4", "--set", "train.warmup=2",
                 "--set", "train.lr=1e-30", "--set", "train.patience=1", "--set", "train.threads=1")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    [cooldown] = [e for e in events if e["event"] == "cooldown"]
    assert cooldown["after"] == 3 and cooldown["seconds"] > 0  # decided at the end of the warm-up
    assert saved(out, "result.json")["info"]["stopped"] == "no improvement in 1 evaluations (patience)"


def test_epochs_0_needs_another_budget(cli, tmp_path):
    result = cli("run", "copy", "--out", str(tmp_path / "r"), "--quiet", "--set", "train.epochs=0")
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: config: train.epochs=0 (no epoch cap) needs a --time-limit or "
                                     "train.max_steps")


def test_a_resumed_time_limited_run_keeps_its_recipe_and_budget(cli, sorting, tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    options = ["--quiet", "--time-limit", "60", "--set", "train.pace=300", "--set", "train.epochs=3",
               "--set", "train.keep_last=10"]
    assert cli("run", sorting, "--out", str(full), *options).exit_code == 0
    shutil.copytree(full, crashed)
    for later in sorted((crashed / "checkpoints").glob("step-*"))[1:]:
        shutil.rmtree(later)
    (crashed / "result.json").unlink()
    resumed = cli("run", "--resume", str(crashed), "--quiet", "--set", "train.pace=1")
    assert resumed.exit_code == 2  # a resume takes nothing new, not even a pace
    assert cli("run", "--resume", str(crashed), "--quiet").exit_code == 0
    assert saved(crashed, "config.json") == saved(full, "config.json")
    before, after = (saved(d, "result.json")["info"] for d in (full, crashed))
    assert after["recipe"] == before["recipe"] and after["steps"] == before["steps"]
    assert saved(crashed, "result.json")["metrics"] == saved(full, "result.json")["metrics"]


def test_measuring_the_pace_leaves_the_run_as_it_would_be(cli, sorting, tmp_path):
    measured, given = tmp_path / "measured", tmp_path / "given"
    options = ["--quiet", "--time-limit", "60", "--set", "train.max_steps=4", "--set", "train.eval_every=2",
               "--set", "model.dropout=0.1",  # dropout: a random state moved by the probe would show
               "--set", "decode.engine=torch"]  # outputs of one decoder, whichever the probe timed faster
    assert cli("run", sorting, "--out", str(measured), *options).exit_code == 0
    recipe = saved(measured, "result.json")["info"]["recipe"]
    assert recipe["pace_source"] == "measured" and recipe["pace"] > 0
    # the same recipe from a given pace, with no probe: the same updates and evaluations
    assert cli("run", sorting, "--out", str(given), *options, "--set", f"train.pace={recipe['pace']}").exit_code == 0
    assert saved(given, "result.json")["info"]["recipe"]["name"] == recipe["name"]

    def evals(run):
        return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == "eval"]
    assert evals(measured) == evals(given) and len(evals(given)) == 2
    assert saved(measured, "result.json")["metrics"] == saved(given, "result.json")["metrics"]


class DrawingSorting(Sorting):
    """budget-sort whose metric draws ``draws`` numbers from torch's random generator, as a sampled
    (bootstrap) metric would."""

    draws = 0

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        torch.rand(self.draws)
        return super().taskformer_metrics(hypotheses, references)


def test_a_validation_that_draws_random_numbers_leaves_the_training_as_it_would_be(cli, register, tmp_path):
    """Whatever a validation draws (a metric's sampling, our decoder's own layers; a runtime draws
    nothing), the updates after it draw the dropout they would have drawn."""
    plugin = register(DrawingSorting(), "budget-sort-draws")

    def evals(draws):
        plugin.draws, out = draws, tmp_path / str(draws)
        result = cli("run", "budget-sort", "--out", str(out), "--quiet", "--set", "train.max_steps=4",
                     "--set", "train.eval_every=1", "--set", "model.dropout=0.1", "--set", "decode.engine=torch")
        assert result.exit_code == 0, result.output
        lines = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        return [e["loss"] for e in lines if e["event"] == "eval"]
    drawn, none = evals(1000), evals(0)
    assert len(drawn) == 4 and drawn == none


def test_a_task_that_sets_its_own_patience_keeps_it_under_a_time_limit(cli):
    # couplet's checkpoint metric is noisy, so it waits longer than the time limit's default
    result = cli("run", "couplet", "--data-dir", str(DATA / "couplets"), "--dry-run", "--quiet", "--time-limit", "60",
                 "--set", "train.threads=1", "--set", "data.val_size=6")
    assert result.exit_code == 0, result.output
    patience = plugins().task("couplet").defaults["train"]["patience"]
    assert patience != TIME_LIMIT_PATIENCE
    assert f"stop after {patience} evaluations without improvement" in result.stdout


class ShortBudget(Sorting):
    """The sorting task with a long warm-up and a table whose smallest recipe needs 1 M target tokens."""

    TASK = Task("budget-short", "Sort five digits (a long warm-up, a table that starts at 1 M)", metric="exact_match",
                defaults={**Sorting.TASK.defaults, "train": {**Sorting.TASK.defaults["train"], "warmup": 4000}},
                recipes=((1e6, {"model": {"d_ff": 96}}, "a wider FFN"),))


@pytest.fixture
def short(register):
    register(ShortBudget(), "budget-short-plugin")
    return "budget-short"


def test_a_short_budget_cuts_the_warm_up_to_a_share_of_the_updates_it_buys(cli, register, tmp_path):
    """...and the row's network is timed once: the warm-up it cuts is no new network to time."""
    out, plugin = tmp_path / "run", ShortBudget()
    register(plugin, "budget-short-plugin")
    _, recipe = paced_run(cli, "budget-short", out, 10)
    assert plugin.widths.count(96) == 2  # the row's probe, then the run's own network
    warmup = saved(out, "config.json")["config"]["train"]["warmup"]
    assert 1 <= warmup == recipe["overrides"]["train"]["warmup"] <= 0.1 * max(recipe["planned_updates"], 100) + 1 < 4000
    assert recipe["name"] == f"model.d_ff=96, train.warmup={warmup}, train.warmup_share=0.1"


def test_a_plan_of_few_updates_keeps_the_warm_up_of_the_least_plan_that_learns():
    """A probe on a busy machine plans few updates; the run makes more once the machine frees up (its
    decay follows the time), so its warm-up is never cut below a tenth of the least plan that learns."""
    def plan(updates_per_token):
        return budget.choose([(0, {}, "any budget")], "test", 100.0, lambda overrides: 100.0, "measured",
                             lambda overrides: (updates_per_token, 1000))
    few, many = plan(0.0016), plan(0.1)  # 10,000 target tokens: 16 updates, or 1,000
    assert (few["planned_updates"], few["overrides"]["train"]["warmup"]) == (16, 10)
    assert (many["planned_updates"], many["overrides"]["train"]["warmup"]) == (1000, 100)


def test_a_budget_below_the_smallest_recipe_says_so_before_training_and_in_the_report(cli, short, tmp_path):
    out = tmp_path / "run"
    result, recipe = paced_run(cli, short, out, 10)
    assert re.match(r"the budget, 3[56](\.\d)? k target tokens, is below the 1 M that the task's smallest "
                    "recipe needs; about 1666.7 min of training would reach it", recipe["short"]), recipe["short"]
    warned = result.stderr.index(f"warning: {recipe['short']}")
    assert warned < result.stderr.index("training: first update done")  # before training
    assert re.search(r"training: first update done [0-9.]+ s after the command started", result.stderr)
    assert "budget warning" in (out / "report.txt").read_text()
    plan = cli("run", short, "--dry-run", "--quiet", "--time-limit", "60", "--set", "train.pace=10")
    assert plan.exit_code == 0 and re.search(r"warning: the budget, 3[56](\.\d)? k target tokens", plan.stdout)


def test_your_warm_up_stands_and_is_named(cli, short, tmp_path):
    result = cli("run", short, "--dry-run", "--quiet", "--time-limit", "60", "--set", "train.pace=10",
                 "--set", "train.warmup=3000")
    assert result.exit_code == 0, result.output
    assert "the first 3,000 warming up" in result.stdout
    assert "overridden by your settings: train.warmup" in result.stdout


@pytest.mark.parametrize("minutes", ["nan", "inf"])  # 0 and below: click refuses them
def test_a_time_limit_that_is_not_a_positive_number_is_refused_before_any_work(cli, tmp_path, minutes):
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", minutes)
    assert result.exit_code == 2 and not out.exists()
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: --time-limit must be a positive, finite number of minutes") and \
        line.endswith(f"got {float(minutes)}")


def test_a_time_limit_too_short_for_the_final_evaluation_is_refused_before_training(cli, short, tmp_path):
    out = tmp_path / "run"
    result = cli("run", short, "--out", str(out), "--time-limit", "1e-6", "--set", "train.pace=10")
    assert result.exit_code == 2 and not out.exists()  # nothing written: the run directory comes after the plan
    [line] = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("Error: --time-limit 1e-06 leaves no time to train")
    minimum = re.search(r"give at least ([0-9.]+) minutes \(for 100 updates at 10 tok/s\)", line)
    assert minimum and float(minimum[1]) >= 0.5


# Ten minutes less the start and the final evaluation: 9 to 9.9 minutes of training, whatever the machine.
@pytest.mark.parametrize("pace, members", [(1, 1), (10, 3), (100, 20)])
def test_agnews_trains_fewer_members_where_the_budget_cannot_feed_twenty(cli, pace, members):
    result = cli("run", "agnews", "--data-dir", str(DATA / "ag_news"), "--dry-run", "--quiet", "--time-limit", "10",
                 "--set", f"train.pace={pace}", "--set", "train.threads=1")
    assert result.exit_code == 0, result.output
    [model] = [line for line in result.stdout.splitlines() if line.startswith("model: ")]
    assert model.endswith("parameters") and (f", {members} members:" in model) == (members > 1)


def test_an_ensemble_row_is_timed_decoding_with_its_own_members(cli, monkeypatch):
    """An ensemble's members decode together (and one network may decode on a runtime an ensemble cannot):
    each row of other members than the probe's twenty that the budget may reach is timed on a throwaway of
    its own, once, not the probe's figure scaled by the members. The final evaluation kept is the chosen
    row's own timing."""
    from taskformer.app import prepare
    from taskformer.app.decodetime import DecodeTiming
    timed = []

    def decode_seconds(run, data):
        members = run.config.model.members
        timed.append(members)
        return DecodeTiming(final=members**2 / 100, validation=0.0, fixed=0.0)  # not linear in the members
    monkeypatch.setattr(prepare, "decode_seconds", decode_seconds)
    result = cli("run", "agnews", "--data-dir", str(DATA / "ag_news"), "--dry-run", "--time-limit", "10",
                 "--set", "train.pace=10", "--set", "train.threads=1")
    assert result.exit_code == 0, result.output
    # the probe's network, then the row chosen: five members' 7 k tokens are out of reach of 10 tok/s for
    # under 10 minutes whatever they keep back, so they are not timed
    assert timed == [20, 3]
    [model] = [line for line in result.stdout.splitlines() if line.startswith("model: ")]
    [data] = [line for line in result.stdout.splitlines() if line.startswith("data: ")]
    val, test = (re.search(rf"\b{split} (\d+)", data)[1] for split in ("val", "test"))
    [final] = re.findall(r"final evaluation: about (\d+) s", result.stdout)  # 14 s if scaled from twenty members
    assert ", 3 members:" in model and int(final) == round(3**2 / 100 * (int(val) + int(test)))


def test_a_short_translation_budget_ends_its_schedule_on_smaller_batches(cli):
    out = translate_plan(cli, "--time-limit", "60", "--set", "train.pace=1000")  # about 3.6 M target tokens
    [line] = [line for line in out.splitlines() if line.startswith("recipe: ")]
    assert line.startswith("recipe: train.cooldown=0.3, train.average_last=0, train.eval_every=400, "
                           "train.max_tokens=2048")
    assert "(from 0: a short budget" in line


def test_a_row_that_changes_only_the_batches_is_not_timed_again_on_a_cpu(cli, monkeypatch):
    """The short row's smaller batches train at about the probe's tokens per second on a CPU: neither
    its pace nor its decoding is timed again."""
    from taskformer.app import prepare
    paced, timed, decode_seconds = [], [], prepare.decode_seconds
    monkeypatch.setattr(budget, "measure_pace", lambda model, cfg, *rest: paced.append(cfg.max_tokens) or (1000.0, 1.0))
    monkeypatch.setattr(prepare, "decode_seconds", lambda *args: timed.append(1) or decode_seconds(*args))
    out = translate_plan(cli, "--time-limit", "60")  # about 3.6 M target tokens: the short row
    assert "train.max_tokens=2048, train.warmup=" in out and paced == [4096] and len(timed) == 1


def test_a_run_stopped_by_its_budget_finishes_when_its_last_evaluation_exhausts_the_patience(cli, tmp_path):
    """The stop's own last evaluation (of the updates since the one before) may be the one without
    improvement that reaches ``train.patience``: the run still finishes and writes its result. This
    ended an hour of training with an internal error. A rate of 1e-30 never improves the score."""
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--quiet", "--set", "data.train_size=40", "--set",
                 "data.val_size=4", "--set", "data.test_size=4", "--set", "train.lr=1e-30", "--set",
                 "train.eval_every=2", "--set", "train.max_steps=5", "--set", "train.epochs=10", "--set",
                 "train.patience=2")
    assert result.exit_code == 0, result.output
    evaluated = [e["step"] for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                 if e["event"] == "eval" and e.get("split") == "val"]
    assert evaluated[:3] == [2, 4, 5]  # the stop's own evaluation at step 5 is the second without improvement
    assert saved(out, "result.json")["info"]["stopped"] == "reached train.max_steps=5"
