"""Plugin discovery, per-task dispatch, the old plugin API, and plugins that misbehave."""
import json
from pathlib import Path

import legacy_plugin
import pytest
import torch

from conftest import run_cli
from taskformer import Task, TaskData, hookimpl, symbols

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "taskformer-reverse"


def fake_distribution(site: Path, name: str, entry_points: dict[str, str]) -> None:
    """Install-free stand-in for `pip install`: a dist-info folder declaring entry points on sys.path."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[taskformer]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))


@pytest.fixture
def site(tmp_path):
    path = tmp_path / "site"
    path.mkdir()
    return path


def env_for(*paths: Path) -> dict:
    return {"PYTHONPATH": ":".join(str(p) for p in paths)}


def test_external_plugin_is_discovered_and_runs_by_name(site, tmp_path):
    fake_distribution(site, "taskformer_reverse", {"reverse": "taskformer_reverse"})
    env = env_for(site, EXAMPLE)
    listed = run_cli("tasks", env=env)
    assert listed.returncode == 0 and "reverse" in listed.stdout
    out = tmp_path / "run"
    trained = run_cli("run", "reverse", "--out", str(out), "--quiet", "--set", "train.epochs=2", env=env)
    assert trained.returncode == 0, trained.stderr
    assert (out / "model.safetensors").is_file()
    assert "Accuracy by position" in (out / "report.txt").read_text()  # the plugin's report section
    predicted = run_cli("predict", str(out), input="1 2 3 4 5 6\n\n", env=env)
    assert predicted.returncode == 0, predicted.stderr
    lines = predicted.stdout.split("\n")
    assert len(lines) == 3 and lines[1] == "" and len(lines[0].split()) == 6  # its decoder fixes the length
    examples = run_cli("reverse-examples", "-n", "2", env=env)  # its own subcommand
    assert examples.returncode == 0
    assert [a.split() == list(reversed(b.split())) for a, b in
            (line.split("\t") for line in examples.stdout.splitlines())] == [True, True]


def test_plugin_that_fails_to_import_is_named_and_others_keep_working(site):
    (site / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    fake_distribution(site, "broken_plugin", {"broken": "broken_plugin"})
    result = run_cli("tasks", env=env_for(site))
    assert result.returncode == 0
    assert "copy" in result.stdout
    assert "broken" in result.stdout
    assert "plugin 'broken' failed to load (RuntimeError: boom at import)" in result.stderr


def test_plugin_that_returns_the_wrong_type_is_named(site):
    (site / "wrong_plugin.py").write_text(
        "from taskformer.plugins import hookimpl\n"
        "@hookimpl\n"
        "def taskformer_tasks():\n"
        "    return 'not a list of tasks'\n")
    fake_distribution(site, "wrong_plugin", {"wrong": "wrong_plugin"})
    result = run_cli("tasks", env=env_for(site))
    assert result.returncode == 0 and "copy" in result.stdout
    assert "wrong" in result.stdout
    assert "plugin 'wrong' taskformer_tasks raised TypeError" in result.stderr and "list of Task" in result.stderr


def test_plugin_raising_in_a_hook_is_a_one_line_error_naming_it(site, tmp_path):
    (site / "raising_plugin.py").write_text(
        "from taskformer.plugins import Task, hookimpl\n"
        "@hookimpl\n"
        "def taskformer_tasks():\n"
        "    return [Task(name='explode', description='raises in its data hook')]\n"
        "@hookimpl\n"
        "def taskformer_data(task):\n"
        "    if task.name == 'explode':\n"
        "        raise KeyError('missing column')\n")
    fake_distribution(site, "raising_plugin", {"raising": "raising_plugin"})
    result = run_cli("run", "explode", "--out", str(tmp_path / "r"), env=env_for(site))
    assert result.returncode == 2
    assert "raising" in result.stderr and "taskformer_data" in result.stderr and "missing column" in result.stderr
    assert "Traceback" not in result.stderr


def test_plugin_can_add_a_subcommand(site):
    (site / "command_plugin.py").write_text(
        "import click\n"
        "from taskformer.plugins import hookimpl\n"
        "@hookimpl\n"
        "def taskformer_register_commands(cli):\n"
        "    @cli.command()\n"
        "    def hello():\n"
        "        'Say hello.'\n"
        "        click.echo('hello from a plugin')\n")
    fake_distribution(site, "command_plugin", {"command": "command_plugin"})
    result = run_cli("hello", env=env_for(site))
    assert result.returncode == 0 and result.stdout == "hello from a plugin\n"


def test_unknown_task_suggests_close_names_with_exit_code_2():
    result = run_cli("run", "copyy")
    assert result.returncode == 2
    message = result.stderr.strip()
    assert message.startswith("Error: unknown task 'copyy'; did you mean copy") and "\n" not in message


def test_installed_example_plugin_runs_through_the_cli(tmp_path):
    from importlib.metadata import entry_points
    if not any(ep.name == "reverse" for ep in entry_points(group="taskformer")):
        pytest.skip("examples/taskformer-reverse is not pip-installed (README's install line and .ci/run do it)")
    out = tmp_path / "run"
    trained = run_cli("run", "reverse", "--out", str(out), "--quiet")
    assert trained.returncode == 0, trained.stderr
    predicted = run_cli("predict", str(out), "1 2 3 4 5 6")
    assert predicted.returncode == 0 and len(predicted.stdout.split()) == 6


TINY_COPY = ["--quiet", "--set", "train.max_steps=2", "--set", "data.train_size=200", "--set", "data.val_size=20",
             "--set", "data.test_size=20"]


def test_a_plugin_with_guards_still_works_and_hears_only_its_own_task(register, cli, tmp_path):
    legacy_plugin.HEARD.clear()
    register(legacy_plugin, "legacy")
    out = tmp_path / "legacy"
    trained = cli("run", "legacy-sort", "--out", str(out), "--quiet")
    assert trained.exit_code == 0, trained.output
    assert "Sorted samples" in (out / "report.txt").read_text()  # its report section, reading run.samples
    predicted = cli("predict", str(out), "3 1 2 5 4", "--beam", "2")
    assert predicted.exit_code == 0 and len(predicted.stdout.split()) == 5  # its own greedy decoder
    typo = cli("run", "legacy-sort", "--set", "data.lenght=3")  # a plugin's options are checked too
    assert typo.exit_code == 2 and "did you mean 'data.length'" in typo.stderr
    other = cli("run", "copy", "--out", str(tmp_path / "copy"), *TINY_COPY)
    assert other.exit_code == 0, other.output
    assert legacy_plugin.HEARD == {"legacy-sort"}


class EveryTask:
    """A plugin that declares no task: it hears every task's metrics and report."""

    @hookimpl
    def taskformer_metrics(self, task, hypotheses):
        return {"predictions": float(len(hypotheses))}

    @hookimpl
    def taskformer_report_sections(self, task):
        return [("Seen by a cross-cutting plugin", task.name)]


def test_a_plugin_that_declares_no_task_hears_every_task(register, cli, tmp_path):
    register(EveryTask(), "every-task")
    result = cli("run", "copy", "--out", str(tmp_path / "r"), *TINY_COPY)
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "r" / "result.json").read_text())["metrics"]
    assert metrics["test"]["predictions"] == 20.0 and "exact_match" in metrics["test"]
    assert "Seen by a cross-cutting plugin" in (tmp_path / "r" / "report.txt").read_text()


class Faulty:
    """An encoder-only task whose plugin gives one wrong answer, chosen by ``fault``."""

    def __init__(self, fault):
        self.fault = fault

    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="faulty", description="answers wrongly", variant="encoder-only", metric="accuracy",
                     defaults={"model": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "d_ff": 32},
                               "train": {"max_steps": 1}})]

    @hookimpl
    def taskformer_data(self):
        rows = [("a b", "A"), ("b a", "B")] * 4 + ([("a a", "C L")] if self.fault == "target" else [])
        return TaskData(tokenizer=symbols(["a", "b"]), splits={"train": rows, "val": rows[:2], "test": rows[:2]},
                        labels=["A", "B"])

    @hookimpl
    def taskformer_head(self, model_config):
        if self.fault == "head":
            return torch.nn.Linear(model_config.d_model, 2)  # cannot be called as head(hidden, src_mask)

    @hookimpl
    def taskformer_decode(self, src):
        if self.fault == "decode":
            return ["A"] * (len(src) + 1)

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        if self.fault == "metrics":
            return 1.0
        return {"accuracy": 100.0 * sum(h.label == r for h, r in zip(hypotheses, references)) / len(references)}


@pytest.mark.parametrize("fault, expected", [
    ("target", "taskformer_data for task 'faulty': train target 'C L' is not one of its labels ['A', 'B']"),
    ("head", "taskformer_head for task 'faulty': head(hidden, src_mask) must return logits of shape (1, 2)"),
    ("decode", "taskformer_decode for task 'faulty' must return one prediction (a str or a Label) per source "
               "row, got 3 for 2 rows"),
    ("metrics", "taskformer_metrics for task 'faulty' must return a dict of metric name to number, got float"),
])
def test_a_wrong_answer_names_the_plugin_the_hook_and_what_was_expected(register, cli, tmp_path, fault, expected):
    register(Faulty(fault), "faulty-plugin")
    result = cli("run", "faulty", "--out", str(tmp_path / "r"), "--quiet")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: plugin 'faulty-plugin': {expected}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
