"""The reverse plugin end to end through the taskformer command line."""
import json

from click.testing import CliRunner

from taskformer.app.cli import main


def test_taskformer_reverse_trains_and_predicts(tmp_path):
    out = tmp_path / "run"
    runner = CliRunner()
    trained = runner.invoke(main, ["run", "reverse", "--out", str(out), "--quiet", "--set", "train.epochs=2"])
    assert trained.exit_code == 0, trained.output
    metrics = json.loads((out / "result.json").read_text())["metrics"]["test"]
    assert 0.0 <= metrics["exact_match"] <= 100.0
    predicted = runner.invoke(main, ["predict", str(out)], input="1 2 3 4 5 6\n\n9 8 7 6 5 4\n")
    assert predicted.exit_code == 0, predicted.output
    lines = predicted.stdout.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    assert all(len(line.split()) == 6 for line in (lines[0], lines[2]))  # the decoder keeps the length
