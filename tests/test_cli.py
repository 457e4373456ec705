"""The command line end to end on the copy task, and its one-line errors for bad input."""
import json
import re

import pytest

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's


def test_copy_task_reaches_full_exact_match(default_copy_run):
    out, result = default_copy_run
    saved = json.loads((out / "result.json").read_text())
    assert saved["metrics"]["test"]["exact_match"] == 100.0
    assert saved["metrics"]["test"]["token_accuracy"] == 100.0
    assert saved["info"]["data"]["test"] == 1000
    assert "exact_match" in result.stdout and "taskformer report" in result.stdout


def test_run_directory_holds_weights_config_tokenizer_metrics_and_reports(default_copy_run):
    out, _ = default_copy_run
    for name in ("model.safetensors", "config.json", "tokenizer.json", "metrics.jsonl", "report.txt", "report.html"):
        assert (out / name).is_file(), name
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"train", "eval"} <= {e["event"] for e in events}
    assert "Test samples" in (out / "report.txt").read_text()


def test_predict_prints_the_copy(default_copy_run, cli):
    out, _ = default_copy_run
    result = cli("predict", str(out), "1 4 7 2 9 3 5 8 2 6")
    assert result.exit_code == 0
    assert result.stdout == "1 4 7 2 9 3 5 8 2 6\n"


def test_predict_from_stdin_keeps_one_line_per_input(default_copy_run, cli):
    out, _ = default_copy_run
    lines = ["3 1 4 1 5 9 2 6 5 3", "", "10 9 8 7 6 5 4 3 2 1", "   ", "2 7 1 8 2 8 1 8 2 8"]
    result = cli("predict", str(out), input="\n".join(lines) + "\n")
    assert result.exit_code == 0
    assert result.stdout.split("\n")[:-1] == [lines[0], "", lines[2], "", lines[4]]


def test_predict_truncates_overlong_input_with_a_warning(default_copy_run, cli):
    out, _ = default_copy_run
    result = cli("predict", str(out), " ".join(["5"] * 500))
    assert result.exit_code == 0
    assert "truncated" in result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_eval_reevaluates_a_saved_run(default_copy_run, cli):
    out, _ = default_copy_run
    result = cli("eval", str(out), "--split", "test", "--set", "decode.strategy=beam")
    assert result.exit_code == 0, result.output
    assert "100" in result.stdout and "test" in result.stdout


def test_eval_decodes_the_same_with_one_or_several_workers(default_copy_run, cli):
    out, _ = default_copy_run
    one = cli("eval", str(out), "--split", "test", "--set", "decode.workers=1")
    three = cli("eval", str(out), "--split", "test", "--set", "decode.workers=3")
    assert one.exit_code == 0 and three.exit_code == 0, one.output + three.output
    assert ["exact_match", "100.00"] in [line.split() for line in three.stdout.splitlines()]  # metric, test
    assert one.stdout == three.stdout


def test_out_refuses_a_directory_that_holds_a_run(default_copy_run, cli):
    out, _ = default_copy_run
    result = cli("run", "copy", "--out", str(out))
    assert result.exit_code == 2
    assert "already holds a run" in result.stderr


def test_tasks_lists_the_builtin_copy_task(cli):
    result = cli("tasks")
    assert result.exit_code == 0
    assert "copy" in result.stdout and "taskformer.tasks.copy" in result.stdout


@pytest.mark.parametrize("args, expected", [
    (["run", "cpy"], "did you mean copy"),
    (["run", "copy", "--set", "train.lrr=0.1"], "did you mean 'train.lr'"),
    (["run", "copy", "--set", "train.lr=fast"], "train.lr expects float"),
    (["run", "copy", "--set", "model.d_model=30"], "divisible"),
    (["run", "copy", "--set", "train.epochs=-1"], "train.epochs must not be negative"),
    (["run", "copy", "--set", "lr"], "SECTION.KEY=VALUE"),
    (["run", "copy", "--set", "optim.lr=1"], "unknown config section"),
    (["run", "copy", "--set", "data.lenght=3"], "did you mean 'data.length'"),  # a task's typed options
    (["run", "copy", "--set", "data.length=ten"], "data.length expects int"),
    (["run", "copy", "--set", "data.vocab=2"], "data.vocab must be at least 3"),
    (["run", "copy", "--set", "train.threads=-1"], "train.threads must be in [0, 1024]"),
    (["predict", "no/such/run", "1 2"], "no such run directory"),
])
def test_bad_input_is_one_line_error_with_exit_code_2(cli, tmp_path, args, expected):
    result = cli(*[a.replace("no/such", str(tmp_path / "none")) for a in args])
    assert result.exit_code == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_config_file_is_validated(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepoch = 3\n")
    result = cli("run", "copy", "--config", str(bad), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "did you mean 'train.epochs'" in result.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\n")
    assert "not a valid TOML" in cli("run", "copy", "--config", str(broken)).stderr


def test_corrupt_checkpoint_is_refused_by_predict(default_copy_run, cli, tmp_path):
    import shutil
    out, _ = default_copy_run
    bad = tmp_path / "bad-run"
    shutil.copytree(out, bad, ignore=shutil.ignore_patterns("checkpoints"))
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    result = cli("predict", str(bad), "1 2 3")
    assert result.exit_code == 2
    assert "model.safetensors" in result.stderr and "Traceback" not in result.output


@pytest.fixture
def torch_threads():
    """Restores torch's thread count, which a run with train.threads changes for the whole process."""
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_train_threads_sets_torchs_threads_and_the_report_shows_it(cli, tmp_path, torch_threads):
    out = tmp_path / "r"
    result = cli("run", "copy", "--out", str(out), "--quiet", "--set", "train.threads=1", "--set", "train.max_steps=2",
                 "--set", "data.train_size=200", "--set", "data.val_size=20", "--set", "data.test_size=20")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "result.json").read_text())["info"]["threads"] == 1
    assert re.search(r"threads\s+1\s", (out / "report.txt").read_text())
