"""The reverse plugin end to end, in seconds, with taskformer's test helpers."""
from taskformer.testing import cli, dry_run, run_task

SMALL = {"data.train_size": 500}  # a few updates on a little data: the task runs, not how well


def test_taskformer_reverse_trains_reports_and_predicts(tmp_path):
    trained = run_task("reverse", tmp_path / "run", steps=30, settings=SMALL)
    assert 0.0 <= trained.metrics["test"]["exact_match"] <= 100.0
    assert "Accuracy by position" in trained.report  # the plugin's report section
    outputs = trained.model.predict(["1 2 3 4 5 6", "", "9 8 7 6 5 4"])
    assert outputs[1] == "" and [len(o.split()) for o in (outputs[0], outputs[2])] == [6, 6]  # as long as the input
    predicted = cli("predict", trained.dir, input="1 2 3 4 5 6\n\n")
    assert predicted.exit_code == 0 and predicted.stdout.split("\n")[1] == ""  # one output line per input line


def test_taskformer_reverse_options_are_checked_before_any_work():
    assert dry_run("reverse", settings={"data.length": 8})["data"]["train"] == 4000
    refused = cli("run", "reverse", "--dry-run", "--set", "data.length=0")
    assert refused.exit_code == 2 and "data.length must be at least 1" in refused.stderr
