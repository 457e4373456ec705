"""Every user error is one `Error:` line naming the key, option or file at fault, exit code 2 -- never an
"internal error" -- and damaged run files are refused, not half-read."""
import json
import os
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from conftest import DATA, TINY, run_cli

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's


def one_line_error(result, expected):
    assert result.exit_code == 2, result.output
    assert expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "internal error" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args, expected", [
    (["--set", "model.variant=encoder-only"], "model.variant is set by the task"),
    (["--seed", "100000000000000000000000"], "train.seed is out of range"),
    (["--set", "train.seed=100000000000000000000000"], "train.seed is out of range"),
    (["--set", "model.max_len=1"], "model.max_len must be at least 3"),
    (["--set", "model.d_model=1e20"], "model.d_model expects int"),
    (["--set", "model.d_model=1099511627776", "--set", "model.n_heads=1"], "does not fit in memory"),
    (["--set", "train.threads=100000000000"], "train.threads must be in [0, 1024]"),
    (["--set", "model.max_len=1000000000000000"], "lower model.max_len=1000000000000000"),
    (["--set", "train.lr=inf"], "train.lr must be a finite number"),
    (["--set", "train.lr=nan"], "train.lr must be a finite number"),
    (["--set", "train.clip=-5"], "train.clip"),
    (["--set", "decode.max_len_a=nan"], "decode.max_len_a must be a finite number"),
    (["--time-limit", "nan"], "--time-limit must be a positive, finite number"),
    (["--time-limit", "inf"], "--time-limit must be a positive, finite number"),
])
def test_bad_settings_are_refused_before_training(cli, tmp_path, args, expected):
    one_line_error(cli("run", "copy", "--out", str(tmp_path / "r"), *TINY, *args), expected)
    assert not (tmp_path / "r" / "config.json").exists()


def test_bad_out_and_config_paths_are_named(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    one_line_error(cli("run", "copy", "--out", str(tmp_path / "afile"), *TINY), "exists and is not a directory")
    one_line_error(cli("run", "copy", "--out", str(tmp_path / "afile" / "sub"), *TINY),
                   "cannot create the run directory")
    (tmp_path / "list.json").write_text("[1, 2]")
    one_line_error(cli("run", "copy", "--config", str(tmp_path / "list.json")), "list.json: expected sections")


@pytest.mark.parametrize("name, text, expected", [
    ("deep.json", '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep.json: nested too deeply"),
    ("deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n", "deep.toml: nested too deeply"),
    ("big.json", '{"train": {"lr": 1' + "0" * 5000 + "}}", "big.json: not a valid JSON file"),
    ("big.toml", "[train]\nlr = 1" + "0" * 5000 + "\n", "big.toml: not a valid TOML file"),
])
def test_a_config_file_too_deep_or_with_a_huge_number_is_named(cli, tmp_path, name, text, expected):
    (tmp_path / name).write_text(text)
    one_line_error(cli("run", "copy", "--dry-run", "--config", str(tmp_path / name)), expected)


@pytest.mark.parametrize("make", [os.mkfifo, lambda path: path.symlink_to("/dev/zero")])
def test_a_config_file_that_is_not_a_regular_file_is_refused_not_read(tmp_path, make):
    make(tmp_path / "c.toml")  # a FIFO blocked the read, /dev/zero never ended it: a subprocess, so a regression fails
    result = run_cli("run", "copy", "--out", str(tmp_path / "r"), *TINY, "--config", str(tmp_path / "c.toml"),
                     timeout=120)
    assert result.returncode == 2, result.stderr
    expected = f"Error: {tmp_path / 'c.toml'}: not a regular file; --config expects a TOML or JSON file"
    assert result.stderr.strip() == expected
    assert not (tmp_path / "r").exists()


def test_eval_names_a_setting_it_cannot_change(finished, cli):
    one_line_error(cli("eval", str(finished), "--set", "train.lr=1", "--set", "decode.beam=2"),
                   "eval --set changes decoding only, not train.lr:")


def test_new_task_refuses_the_name_of_an_installed_task(cli, tmp_path):
    one_line_error(cli("new-task", "copy", "--dir", str(tmp_path / "p")), "'copy' is already installed")
    assert not (tmp_path / "p").exists()


def test_a_beam_wider_than_the_vocabulary_still_decodes(finished, cli):
    result = cli("predict", str(finished), "--beam", "500", "1 2 3")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split("\n")) == 2


def test_a_huge_beam_is_cut_to_the_vocabulary_and_one_that_cannot_fit_is_refused(finished, cli):
    result = cli("predict", str(finished), "--beam", "1000000", "1 2 3")  # it ran 95 s in 18 GB, then printed nothing
    assert result.exit_code == 0, result.output
    assert "beam 1000000 is wider than the vocabulary (14 tokens); it was cut to 14" in result.stderr
    one_line_error(cli("predict", str(finished), "--beam", "10", "--set", "decode.batch_size=1000000000", "1 2 3"),
                   "decode.beam=10: the search's key/value cache needs up to")
    one_line_error(cli("eval", str(finished), "--set", "decode.strategy=beam", "--set", "decode.beam=10",
                       "--set", "decode.batch_size=1000000000"), "decode.beam=10: the search's key/value cache")


def test_a_checkpoint_too_large_for_the_file_size_limit_is_one_error_with_the_next_step(tmp_path):
    import resource
    import subprocess
    import sys

    def limit():  # 200 KB: config.json and tokenizer.json fit, the first checkpoint does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    result = subprocess.run([sys.executable, "-m", "taskformer", "run", "copy", "--out", str(tmp_path / "r"), *TINY],
                            capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"Error: cannot write {tmp_path / 'r'} (File too large); once it can be "
                                     f"written, then start the run again with --out {tmp_path / 'r'}")


def multi30k(tmp_path, edit):
    data = tmp_path / "multi30k"
    shutil.copytree(DATA / "multi30k", data)
    edit(data)
    return data


def bom(data):
    for name in ("val.de", "val.en"):
        (data / name).write_bytes(b"\xef\xbb\xbf" + (data / name).read_bytes())


@pytest.mark.parametrize("edit, expected", [
    (lambda d: shutil.copy(d / "train.en", d / "train.en.gz"), "both train.en and train.en.gz exist"),
    (lambda d: ((d / "val.de").unlink(), (d / "val.de").mkdir()), "val.de: not a regular file"),
])
def test_ambiguous_or_wrong_data_files_are_named(cli, tmp_path, edit, expected):
    data = multi30k(tmp_path, edit)
    one_line_error(cli("run", "translate-de-en", "--data-dir", str(data), "--out", str(tmp_path / "r"), "--quiet"),
                   expected)


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path):
    import gzip

    from taskformer import read_lines
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfEin Hund.\nZwei\n")
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"\xef\xbb\xbfEin Hund.\n"))
    assert read_lines(tmp_path / "a.txt") == ["Ein Hund.", "Zwei"]
    assert read_lines(tmp_path / "a.txt.gz") == ["Ein Hund."]


def damaged(finished, tmp_path, edit):
    bad = tmp_path / "bad"
    shutil.copytree(finished, bad)
    edit(bad)
    return bad


def retype_weights(run_dir, change):
    tensors = load_file(run_dir / "model.safetensors")
    first = sorted(tensors)[0]
    tensors[first] = change(tensors[first])
    save_file(tensors, run_dir / "model.safetensors")


def truncate(path):
    path.write_bytes(path.read_bytes()[:-15])


@pytest.mark.parametrize("command, edit, expected", [
    ("predict", lambda d: retype_weights(d, lambda t: t.long()), "is stored as I64"),
    ("predict", lambda d: retype_weights(d, lambda t: t > 0), "is stored as BOOL"),
    ("predict", lambda d: retype_weights(d, lambda t: torch.full_like(t, float("nan"))), "NaN or infinite"),
    ("predict", lambda d: truncate(d / "outputs-test.jsonl"), "outputs-test.jsonl:"),
    ("report", lambda d: truncate(d / "metrics.jsonl"), "metrics.jsonl:"),
])
def test_damaged_run_files_are_named(finished, tmp_path, cli, command, edit, expected):
    bad = damaged(finished, tmp_path, edit)
    one_line_error(cli(command, str(bad), *(["1 2"] if command == "predict" else [])), expected)


@pytest.mark.parametrize("key, value, expected", [
    ("step", "5", "state.json: step must be"),
    ("step", True, "state.json: step must be"),
    ("decay", [0, 1.0], "state.json: decay must be"),
    ("decay", [3, -2], "state.json: decay must be"),
    ("decay", [True, 4], "state.json: decay must be"),
    ("decay", 7, "state.json: decay must be"),
    ("clock", {"estimates": {"final evaluation": -1}}, "state.json: clock must be"),
    ("clock", {"per_update": "fast"}, "state.json: clock must be"),
    ("best", 0, "state.json: best must be"),
    ("best", [1.0, "x"], "state.json: best must be"),
    ("best_weights", 3, "state.json: best_weights must be"),
    ("epoch", 1000, "state.json: epoch 1000, batch"),  # once "finished" early with exit 0
    ("batch", 5, "do not agree with"),
])
def test_resume_names_a_damaged_trainer_state(finished, tmp_path, cli, key, value, expected):
    def edit(d):
        (d / "result.json").unlink()  # unfinished again
        state = sorted((d / "checkpoints").glob("step-*"))[-1] / "state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), key: value}))
    one_line_error(cli("run", "--resume", str(damaged(finished, tmp_path, edit)), "--quiet"), expected)


@pytest.mark.parametrize("tail, expected", [
    ("not json\n", "metrics.jsonl: line 2 is not a JSON object with a whole-number step"),
    ('{"step": "x"}\n', "metrics.jsonl: line 2 is not a JSON object with a whole-number step"),
    ("[" * 100_000 + "\n", "metrics.jsonl: line 2 is not a JSON object"),
    ('{"step": 1, "lo', None),  # a cut last line, as a kill mid-append leaves it: dropped, the run resumes
])
def test_resume_names_a_damaged_metrics_log_but_drops_a_cut_last_line(finished, tmp_path, cli, tail, expected):
    def edit(d):
        (d / "result.json").unlink()  # unfinished again
        lines = (d / "metrics.jsonl").read_text().splitlines(keepends=True)
        rest = "".join(lines[1:])
        (d / "metrics.jsonl").write_text(lines[0] + (tail + rest if expected else rest + tail))
    result = cli("run", "--resume", str(damaged(finished, tmp_path, edit)), "--quiet")
    if expected:
        one_line_error(result, expected)
    else:
        assert result.exit_code == 0, result.output
        assert all(json.loads(line) for line in (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines())


def test_runs_skips_a_malformed_result_with_a_warning(finished, tmp_path, cli):
    root = tmp_path / "runs"
    shutil.copytree(finished, root / "good")
    (root / "bad").mkdir()
    (root / "bad" / "result.json").write_text('{"task": "copy", "metric": "x", "info": "no", "metrics": []}')
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "result.json")  # reading it would block forever
    shutil.copytree(finished, root / ("a-long-folder-name-" * 8) / "run")
    result = cli("runs", str(root))  # CliRunner's console is not a terminal, as in a pipe
    assert result.exit_code == 0, result.output
    assert "good" in result.stdout and "copy" in result.stdout
    assert "".join(result.stdout.split()).count(str(root / ("a-long-folder-name-" * 8) / "run")) == 1  # not cut
    assert "skipped" in result.stderr and "bad" in result.stderr and "fifo" in result.stderr


def test_run_files_that_are_not_regular_files_are_refused(finished, tmp_path, cli):
    def edit(d):
        (d / "config.json").unlink()
        (d / "config.json").symlink_to("/dev/zero")
    one_line_error(cli("predict", str(damaged(finished, tmp_path, edit)), "1 2"), "config.json: not a regular file")


# The CLI fuzzed: any --set key of the copy task with any value ends in a result or a one-line Error.
KEYS = ["model.d_model", "model.n_heads", "model.enc_layers", "model.dec_layers", "model.d_ff", "model.dropout",
        "model.max_len", "model.norm_first", "model.pooling", "model.variant", "train.epochs", "train.lr",
        "train.warmup", "train.clip", "train.label_smoothing", "train.schedule", "train.cooldown", "train.accumulate",
        "train.max_tokens", "train.seed", "train.bf16", "train.eval_every", "decode.strategy", "decode.beam",
        "decode.max_len_a", "decode.max_len_b", "decode.batch_size", "decode.length_penalty", "data.vocab",
        "data.length", "no.such", "train.nope"]
VALUES = st.one_of(st.integers(-3, 40).map(str), st.sampled_from(["nan", "inf", "-inf", "1e30", "-0.5", "0.5", "",
                                                                  "true", "beam", "x", "1e400", "9" * 30]),
                   st.text(max_size=12))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3))
def test_any_set_ends_in_a_result_or_a_one_line_error(cli, tmp_path_factory, pairs):
    out = tmp_path_factory.mktemp("fuzz") / "r"
    sets = [a for key, value in pairs for a in ("--set", f"{key}={value}")]
    result = cli("run", "copy", "--out", str(out), "--quiet", "--set", "data.train_size=8", "--set",
                 "data.val_size=2", "--set", "data.test_size=2", "--set", "train.max_steps=1", *sets)
    assert result.exit_code in (0, 2), result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_resume_names_a_config_that_is_not_a_run(tmp_path, cli):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text("[]")
    one_line_error(cli("run", "--resume", str(tmp_path / "r")), "config.json: not a taskformer run config")


def test_output_length_limits_are_checked_and_a_huge_one_means_the_models_positions(finished, cli):
    from taskformer import max_lengths

    one_line_error(cli("predict", str(finished), "--set", "decode.max_len_a=-1", "1 2"), "decode.max_len_a")
    one_line_error(cli("predict", str(finished), "--set", "decode.max_len_b=-5", "1 2"), "decode.max_len_b")
    src = torch.tensor([[5, 6, 7, 2]])  # three tokens and EOS
    assert max_lengths(src, 1e300, 0, 64).tolist() == [63]  # once overflowed to a one-token budget
    assert max_lengths(src, 0.0, 10**18, 64).tolist() == [63]
    assert max_lengths(src, 1.5, 2, 64).tolist() == [8]


def test_cr_only_line_ends_are_lines_and_a_blank_train_file_is_refused(cli, tmp_path):
    from taskformer import read_lines

    (tmp_path / "mac.txt").write_bytes(b"ein Hund\rzwei Katzen\r\rdrei\r")
    (tmp_path / "dos.txt").write_bytes(b"ein Hund\r\nzwei Katzen\r\n\r\ndrei\r\n")
    assert read_lines(tmp_path / "mac.txt") == read_lines(tmp_path / "dos.txt") == ["ein Hund", "zwei Katzen", "",
                                                                                      "drei"]
    data = multi30k(tmp_path, lambda d: (d / "train.en").write_text("\n \n\t\n"))
    one_line_error(cli("run", "translate-de-en", "--data-dir", str(data), "--out", str(tmp_path / "r"), "--quiet"),
                   "train.en: holds only blank lines")


def test_runs_lists_every_readable_run_whatever_the_others_hold(finished, tmp_path, cli):
    root = tmp_path / "runs"
    shutil.copytree(finished, root / "[/]")  # a folder named like rich markup
    result = json.loads((finished / "result.json").read_text())
    malformed = {"number-date": {**result, "info": {**result["info"], "date": 20261125}},
                 "text-wall": {**result, "info": {**result["info"], "wall_seconds": "long"}}}
    for name, saved in malformed.items():
        (root / name).mkdir()
        (root / name / "result.json").write_text(json.dumps(saved))
    (root / "deep").mkdir()
    (root / "deep" / "result.json").write_text('{"task": ' + "[" * 100_000 + "]" * 100_000 + "}")
    shutil.copytree(finished, root / "nan")
    metric = result["metric"]
    (root / "nan" / "result.json").write_text(json.dumps({**result, "metrics": {"test": {metric: float("nan")}}}))
    table = cli("runs", str(root))
    assert table.exit_code == 0, table.output
    assert str(root / "[/]") in table.stdout and str(root / "nan") in table.stdout
    assert all(f"skipped {root / name / 'result.json'}" in table.stderr for name in (*malformed, "deep"))
    listed = cli("runs", str(root), "--json")
    assert listed.exit_code == 0, listed.output
    runs = json.loads(listed.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert {r["path"]: r["metrics"]["test"][metric] for r in runs}[str(root / "nan")] is None


def test_a_text_argument_that_is_not_utf8_is_decoded_as_stdin_is(finished):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "taskformer", "predict", str(finished), b"1 \xff 2", "3 4"],
                            capture_output=True, timeout=300)  # bytes: the shell hands $'1 \xff 2' as it is
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().count("\n") == 2
    assert result.stderr.decode().strip() == ("warning: TEXT argument 1 is not valid UTF-8; its undecodable bytes "
                                              "were replaced by U+FFFD")


def test_predict_says_when_its_outputs_cannot_be_written(finished, tmp_path):
    import resource
    import subprocess
    import sys

    def command(**kw):
        return subprocess.run([sys.executable, "-m", "taskformer", "predict", str(finished)], input="1 2\n" * 50,
                              stderr=subprocess.PIPE, text=True, timeout=300, **kw)

    closed = command(stdout=None, preexec_fn=lambda: os.close(1))  # `>&-`: once exit 0 with every output lost
    assert closed.returncode == 2 and closed.stderr.strip() == ("Error: standard output is closed; predict has "
                                                                "nowhere to write its outputs")
    with open(tmp_path / "out.txt", "wb") as out:  # a file too large (as /dev/full): once an internal OSError
        limited = command(stdout=out, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                            (8, resource.RLIM_INFINITY)))
    assert limited.returncode == 2, limited.stderr
    assert limited.stderr.strip() == "Error: cannot write predict's outputs to standard output (File too large)"
