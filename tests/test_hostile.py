"""A careless or hostile user of the command line and the Python API: each case ends in a right
result or one ``Error:`` line naming what is wrong (exit 2), never a silent wrong result, an internal
error or a half-written folder (docs/robustness.md)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import taskformer
from conftest import TINY

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

CONTROL_TYPED = "1 [EOS] 2 [PAD] [BOS] [UNK] 3"


def one_error(result, *names) -> str:
    """The one ``Error:`` line of a refused command (exit 2), which names each of ``names``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert all(name in errors[0] for name in names), errors[0]
    return errors[0]


def test_control_tokens_typed_in_the_input_are_text(finished, cli):
    """``[EOS]`` typed in an input is not the end of the sentence, nor ``[PAD]`` padding: each is a word
    the copy vocabulary does not hold, as ``zz`` is."""
    model = taskformer.load(finished)
    (_, attention), = model.predict([CONTROL_TYPED], return_attention=True)
    assert attention.source == ["1", "[UNK]", "2", "[UNK]", "[UNK]", "[UNK]", "3", "[EOS]"]
    typed = cli("predict", str(finished), CONTROL_TYPED, "--json")
    unknown = cli("predict", str(finished), "1 zz 2 zz zz zz 3", "--json")
    assert typed.exit_code == 0 and typed.stdout == unknown.stdout
    assert model.predict([CONTROL_TYPED]) == model.predict(["1 zz 2 zz zz zz 3"])


def test_beam_true_is_refused_by_the_api(finished):
    with pytest.raises(taskformer.TaskformerError, match="beam must be a whole number"):
        taskformer.load(finished).predict(["1 2"], beam=True)


@pytest.mark.parametrize("where", ["--set", "--config"])
def test_a_key_the_tokenizer_fills_in_is_refused_not_replaced(cli, tmp_path, where):
    if where == "--set":
        given = ["--set", "model.vocab_size=5"]
    else:
        (tmp_path / "c.toml").write_text("[model]\nvocab_size = 5\n")
        given = ["--config", str(tmp_path / "c.toml")]
    one_error(cli("run", "copy", "--out", str(tmp_path / "run"), *TINY, *given), "model.vocab_size", "tokenizer")
    assert not (tmp_path / "run").exists()


def test_a_pickle_is_refused_whatever_the_case_of_its_name(finished, cli, tmp_path):
    run = shutil.copytree(finished, tmp_path / "run")
    (run / "MODEL.PT").write_bytes(b"\x80\x04K\x01.")
    one_error(cli("predict", str(run), "1 2"), "MODEL.PT", "pickle")
    with pytest.raises(taskformer.TaskformerError, match="pickle"):
        taskformer.load(run)


@pytest.fixture(scope="module")
def exported(finished, tmp_path_factory):
    pytest.importorskip("ctranslate2", reason="the export tests need ctranslate2 (the test extra)")
    from click.testing import CliRunner

    from taskformer.app.cli import main

    out = tmp_path_factory.mktemp("export") / "ct2"
    result = CliRunner().invoke(main, ["export", str(finished), "--to", "ctranslate2", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_predict_on_an_export_says_what_the_folder_is(exported, cli):
    said = one_error(cli("predict", str(exported), "1 2"), str(exported), "CTranslate2", "taskformer export")
    assert "pickle" not in said


def test_export_where_nothing_can_be_written_is_one_error(finished, exported, cli):
    one_error(cli("export", str(finished), "--to", "ctranslate2", "/proc/self/taskformer-export"),
              "/proc/self/taskformer-export", "cannot write")


def test_export_overwrite_never_removes_a_folder_its_record_lists(finished, exported, cli, tmp_path):
    target = shutil.copytree(exported, tmp_path / "ct2")
    record = json.loads((target / "taskformer.json").read_text())
    (target / "taskformer.json").write_text(json.dumps({**record, "files": record["files"] + ["notes"]}))
    (target / "notes").mkdir()
    (target / "notes" / "mine.txt").write_text("the user's")
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    one_error(cli("export", str(finished), "--to", "ctranslate2", str(target), "--overwrite"), "notes", "folder")
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("args, named", [
    (["--time-limit", "nan"], "--time-limit"),
    (["--time-limit", "1e308"], "--time-limit"),  # pace x time overflowed after the pace probe
    (["--time-limit", "100", "--set", "train.pace=1e306"], "train.pace"),
])
@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_a_time_budget_no_number_holds_is_refused_before_any_work(cli, tmp_path, args, named, dry):
    one_error(cli("run", "copy", "--out", str(tmp_path / "run"), *TINY, *args, *dry), named)
    assert not (tmp_path / "run").exists()


def test_a_run_directory_removed_while_training_is_one_error_with_the_next_step(tmp_path):
    run = tmp_path / "run"
    training = subprocess.Popen([sys.executable, "-m", "taskformer", "run", "copy", "--out", str(run), "--quiet",
                                 "--set", "data.train_size=200", "--set", "train.max_steps=2000", "--set",
                                 "train.save_every=5", "--set", "train.eval_every=0", "--set", "train.threads=1"],
                                stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(6000):  # polls of the run's state, a tenth of a second apart
            if training.poll() is not None or list((run / "checkpoints").glob("step-*")):
                break
            time.sleep(0.1)
        shutil.rmtree(run)
        _, stderr = training.communicate(timeout=600)
    finally:
        training.kill()
    assert training.returncode == 2, stderr
    assert stderr.strip().splitlines() == [f"Error: cannot write {run} (it no longer exists); once it can be "
                                           f"written, then start the run again with --out {run}"]


def test_runs_passes_over_entries_that_vanish_while_it_scans(cli):
    """Processes come and go while ``runs /proc`` walks their entries."""
    churn = subprocess.Popen(["sh", "-c", "i=0; while [ $i -lt 20000 ]; do /bin/true; i=$((i+1)); done"])
    try:
        listed = cli("runs", "/proc")
    finally:
        churn.kill()
        churn.wait()
    assert listed.exit_code == 0 and "Error" not in listed.output, listed.output


def test_predict_with_stdin_closed_says_where_inputs_come_from(finished):
    closed = subprocess.run([sys.executable, "-m", "taskformer", "predict", str(finished)], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, preexec_fn=lambda: os.close(0))
    assert closed.returncode == 2, closed.stderr
    assert closed.stderr.strip().splitlines() == ["Error: standard input is closed; give the inputs as TEXT arguments "
                                                  "or pipe them in"]


@pytest.mark.parametrize("name, where, says", [
    ("a" * 300, "pkg", "at most 64 characters"),
    ("sort-digits", "/proc/taskformer-sort-digits", "cannot write a package there"),
])
def test_new_task_refuses_what_it_cannot_write_and_leaves_nothing_half_written(cli, tmp_path, name, where, says):
    target = tmp_path / where
    one_error(cli("new-task", name, "--dir", str(target)), says)
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_new_task_writes_the_whole_package_or_nothing(cli, tmp_path):
    (tmp_path / "pkg").mkdir()
    assert cli("new-task", "sort-digits", "--dir", str(tmp_path / "pkg")).exit_code == 0
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "pkg", "pkg/README.md", "pkg/pyproject.toml", "pkg/taskformer_sort_digits.py", "pkg/tests",
        "pkg/tests/test_taskformer_sort_digits.py"]


def test_the_api_refuses_a_setting_changed_by_hand_to_something_unknown(finished):
    model = taskformer.load(finished)
    model.config.decode.quantize = "int4"
    with pytest.raises(taskformer.TaskformerError, match="decode.quantize must be none or int8, not 'int4'"):
        model.predict(["1 2"])


@pytest.mark.parametrize("row, named", [
    ({"source": "1 2", "output": 5, "reference": "1 2"}, "'output' is 5"),
    ({"source": ["1 2"], "output": "1 2", "reference": "1 2"}, "'source' is"),
    ({"source": "1 2", "output": "1 2", "reference": "1 2", "fields": 3}, "'fields' is 3"),
])
def test_a_damaged_outputs_file_is_named_not_blamed_on_a_plugin(finished, cli, tmp_path, row, named):
    run = shutil.copytree(finished, tmp_path / "run")
    (run / "outputs-test.jsonl").write_text(json.dumps(row) + "\n")
    for command in (["report", str(run)], ["predict", str(run), "1 2"]):
        said = one_error(cli(*command), str(run / "outputs-test.jsonl"), named)
        assert "plugin" not in said


def test_a_data_file_too_small_to_split_is_said_not_blamed_on_a_plugin(cli, tmp_path, data_dir):
    import gzip

    (tmp_path / "ag").mkdir()
    with gzip.open(data_dir / "ag_news" / "train.csv.gz", "rt", encoding="utf-8") as f:
        (tmp_path / "ag" / "train.csv").write_text(f.readline(), encoding="utf-8")
    shutil.copy(data_dir / "ag_news" / "test.csv", tmp_path / "ag")
    said = one_error(cli("run", "agnews", "--data-dir", str(tmp_path / "ag"), "--out", str(tmp_path / "run"),
                         "--quiet"), str(tmp_path / "ag"), "no val split", "give more rows")
    assert "plugin" not in said


def test_a_text_setting_of_20_mb_is_named_in_one_short_line(cli, tmp_path):
    (tmp_path / "big.toml").write_text('[train]\nbf16 = "' + "a" * 20_000_000 + '"\n')
    said = one_error(cli("run", "copy", "--config", str(tmp_path / "big.toml"), "--out", str(tmp_path / "run")),
                     "train.bf16 is a text of 20,000,000 characters")
    assert len(said) < 200


def test_weights_that_cannot_be_read_are_named_as_such(finished, tmp_path):
    from test_robustness import unprivileged

    run = shutil.copytree(finished, tmp_path / "run")
    (run / "model.safetensors").chmod(0)
    refused = subprocess.run(unprivileged("predict", str(run), "1 2"), capture_output=True, text=True)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [f"Error: {run / 'model.safetensors'}: cannot read the weights "
                                                   "(Permission denied)"]


class EarlierApiPlugin:
    """A plugin written for the plugin API before ``data_options``: its data options as free-form defaults."""

    @taskformer.hookimpl
    def taskformer_tasks(self):
        return [taskformer.Task("earlier-api", "A task of the earlier plugin API", metric="exact_match",
                                defaults={"data": {"train_size": 40, "length": 5}})]


def test_a_plugin_of_the_earlier_api_is_told_how_to_declare_its_options(cli, register, tmp_path):
    register(EarlierApiPlugin(), "earlier-api")
    said = one_error(cli("run", "earlier-api", "--out", str(tmp_path / "run")), "earlier-api", "train_size, length",
                     "data_options=", "option(default, help, range)")
    assert "unknown config key" not in said
