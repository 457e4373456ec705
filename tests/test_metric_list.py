"""Metrics are a metric/value list, never cut: in `eval`'s output, its --json, and the report files."""
import json
import shutil

import pytest

from taskformer import hookimpl

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's

LONG = [f"a_rather_long_metric_name_number_{i:02d}_that_no_column_could_hold" for i in range(12)]


class ManyMetrics:
    """A plugin that declares no task, so it adds its metrics to every task's."""

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        return {name: 10.0 + i for i, name in enumerate(LONG)}


def test_many_long_metrics_are_listed_whole_in_eval_and_its_json(cli, register, finished):
    register(ManyMetrics(), "many-metrics")
    shown = cli("eval", str(finished), "--split", "test")
    assert shown.exit_code == 0, shown.output
    rows = [line.split() for line in shown.stdout.splitlines()]
    values = {row[0]: row[1] for row in rows if len(row) == 2}
    assert all(values[name] == f"{10.0 + i:,.2f}" for i, name in enumerate(LONG)), shown.stdout
    header = rows.index(["metric", "test"])
    names = [row[0] for row in rows[header + 1:] if len(row) == 2]
    first = names.index(LONG[0])
    assert names[0] == "exact_match" and names[first : first + len(LONG)] == LONG  # the task's metric, then hook order
    as_json = json.loads(cli("eval", str(finished), "--split", "test", "--json").stdout)
    assert as_json["metrics"]["test"][LONG[-1]] == 21.0 and as_json["task"] == "copy"


def test_listings_are_whole_when_piped_and_have_json(cli, tmp_path, finished):
    listed = cli("tasks")
    assert any(line.split()[1] == "translate-en-zh" for line in listed.stdout.splitlines() if "│" in line)
    assert any(len(line) > 80 for line in listed.stdout.splitlines())  # not cut to 80 columns
    tasks = json.loads(cli("tasks", "--json").stdout)["tasks"]
    assert {"name": "copy", "variant": "encoder-decoder", "metric": "exact_match",
            "description": next(t["description"] for t in tasks if t["name"] == "copy"),
            "plugin": "taskformer.tasks.copy"} in tasks
    deep = tmp_path / ("a-folder-with-a-long-name-" * 4) / "copy"
    shutil.copytree(finished, deep)
    runs = cli("runs", str(tmp_path))
    assert str(deep) in runs.stdout  # the full path on one line
    assert json.loads(cli("runs", str(tmp_path), "--json").stdout)[0]["path"] == str(deep)
