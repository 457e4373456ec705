"""Robustness, round five: the new surfaces (sampling, distill, the data cache, streams) held to the
old standard -- one ``Error:`` line naming the culprit, nothing of the user's lost, no hang, no raw
control character on a terminal, a record that says what ran."""

import json
import logging
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import on_a_terminal, run_cli, run_here
from taskformer.app.datacache import KEEP, MARK, VERSION
from taskformer.core.data import Encoded
from taskformer.core.engine import Trainer
from taskformer.core.errors import TaskformerError
from taskformer.core.model import Transformer
from taskformer.core.model_config import ModelConfig
from taskformer.core.train_config import TrainConfig

# The tests that start the command line as a process (training, serving, refusing) are the full run's, not the
# quick tier's; the in-process ones stay quick.
SLOW = pytest.mark.slow

LM = ["--set", "train.max_steps=3", "--set", "model.max_len=16", "--set", "model.d_model=16",
      "--set", "model.n_heads=2", "--set", "model.d_ff=32", "--quiet"]
TEXT = "".join(f"Line {i} of a small play, said twice.\n" for i in range(40))


def text_dir(tmp_path, text, name="d"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "input.txt").write_text(text)
    return folder


def one_error_line(result, *words):
    """The command was refused as bad input: exit 2, one ``Error:`` line holding ``words``, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


# -- a split that yields no batch: refused before training, never an endless count of empty epochs ----------

@pytest.mark.parametrize("dry", [False, True])
@SLOW
def test_a_text_shorter_than_one_block_is_refused_before_training(tmp_path, dry):
    data = text_dir(tmp_path, "a")
    out = tmp_path / "run"
    result = run_here("run", "shakespeare-char", "--data-dir", str(data), "--out", str(out), *LM,
                      *(["--dry-run"] if dry else []))
    one_error_line(result, "train split", "at least 2 tokens")
    assert not out.exists()


@pytest.mark.parametrize("dry", [False, True])
@SLOW
def test_a_val_text_with_nothing_to_score_is_refused_before_training(tmp_path, dry):
    data = text_dir(tmp_path, TEXT)
    out = tmp_path / "run"
    result = run_here("run", "shakespeare-char", "--data-dir", str(data), "--out", str(out), *LM,
                      "--set", "data.val_fraction=0.0001", *(["--dry-run"] if dry else []))
    one_error_line(result, "val split", "nothing to score")
    assert not out.exists()


@SLOW
def test_more_processes_than_batches_is_refused_by_the_dry_run(tmp_path):
    data = text_dir(tmp_path, TEXT)  # one batch of blocks an epoch: a second process would have none
    result = run_here("run", "shakespeare-char", "--data-dir", str(data), *LM, "--set", "train.max_tokens=4096",
                      "--nproc", "2", "--dry-run")
    one_error_line(result, "1 batch of", "2 training processes", "--nproc 1")


def test_the_training_loop_refuses_data_that_gives_no_update(tmp_path):
    model = Transformer(ModelConfig(vocab_size=25, d_model=16, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32))
    trainer = Trainer(model, TrainConfig(epochs=0, max_steps=3), Encoded(src=[], tgt=[]), lambda: {"loss": 1.0},
                      ("loss", False), tmp_path, torch.device("cpu"))
    with pytest.raises(TaskformerError, match="no update"):
        trainer.fit()


# -- the data cache prunes only what it named and wrote -----------------------------------------------------

def test_pruning_the_cache_removes_only_its_own_entries(cli, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TASKFORMER_CACHE", str(cache))
    data = cache / "data"
    data.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / MARK).write_text("{}")
    (outside / "thesis.tex").write_text("years of work")
    mine = {"photos": "{}", "0" * 32: json.dumps({"format": VERSION}),
            "1" * 32: json.dumps({"format": VERSION, "key": "another"})}
    for name, mark in mine.items():  # a user's folders that look a little like entries: a mark, a key's name
        (data / name).mkdir()
        (data / name / MARK).write_text(mark)
        (data / name / "notes.txt").write_text("mine")
    (data / ("2" * 32)).symlink_to(outside, target_is_directory=True)
    genuine = [f"{i:x}" * 32 for i in range(3, 3 + KEEP)]
    for name in genuine:  # entries of the cache's own format, newer than the user's folders
        (data / name).mkdir()
        (data / name / MARK).write_text(json.dumps({"format": VERSION, "key": name}))
    for age, path in enumerate([*(data / n for n in mine), data / ("2" * 32), *(data / n for n in genuine)]):
        os.utime(path, (1_000_000 + age, 1_000_000 + age), follow_symlinks=False)
    result = cli("run", "shakespeare-char", "--data-dir", str(text_dir(tmp_path, TEXT)), "--out",
                 str(tmp_path / "run"), *LM)
    assert result.exit_code == 0, result.output
    for name in mine:
        assert (data / name / "notes.txt").read_text() == "mine"
    assert (outside / "thesis.tex").read_text() == "years of work" and (data / ("2" * 32)).is_symlink()
    assert not (data / genuine[0]).exists() and all((data / n).exists() for n in genuine[1:])


# -- text from a file, a model or a client reaches a terminal with its control characters visible -----------

HOSTILE = "\x1b]0;PWN\x07\x1b[2J\x9b31m\u202e"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A finished tiny language model whose text (and so its vocabulary) is full of control characters."""
    data = tmp_path_factory.mktemp("hostile-text")
    (data / "input.txt").write_text((f"{HOSTILE} said {HOSTILE}\n") * 60)
    out = tmp_path_factory.mktemp("runs") / "lm"
    result = run_here("run", "shakespeare-char", "--data-dir", str(data), "--out", str(out), *LM,
                      "--set", "train.max_tokens=256", "--set", "decode.max_new_tokens=40")
    assert result.returncode == 0, result.stderr
    return out


@SLOW
def test_a_run_record_with_control_characters_is_reported_with_them_visible(lm_run, tmp_path):
    run = Path(shutil.copytree(lm_run, tmp_path / "run"))
    result_file = run / "result.json"
    record = json.loads(result_file.read_text())
    record["info"]["distill"] = {"teacher": HOSTILE, "teacher_search": {"beam": 1}, "teacher_members": 1,
                                 "count": 3, "file": "distill-train.jsonl", "mix": True}
    record["info"]["device"] = HOSTILE
    result_file.write_text(json.dumps(record))
    config_file = run / "config.json"
    config_file.write_text(config_file.read_text().replace('"data_dir": ', f'"data_dir": {json.dumps(HOSTILE)}, "x": '))
    result = run_here("report", str(run))
    assert result.returncode == 0, result.stderr
    for shown in (result.stdout, (run / "report.txt").read_text(), (run / "report.html").read_text()):
        assert not CONTROL.search(shown)
        assert "\\x1b]0;PWN\\x07" in shown


@SLOW
def test_predict_on_a_terminal_shows_a_models_control_characters_as_escapes(lm_run):
    for json_flag in ([], ["--json"]):
        text = on_a_terminal("predict", str(lm_run), "said", *json_flag, "--set", "decode.temperature=2.0")
        assert "\\x1b" in text or "\\u001b" in text, text  # the model wrote ESC: shown, not sent
        assert not CONTROL.search(text), text
        if json_flag:
            json.loads(text)


@SLOW
def test_an_error_naming_a_file_shows_its_control_characters_as_escapes(tmp_path):
    result = run_here("run", "copy", "--config", str(tmp_path / f"{HOSTILE}.toml"), "--quiet")
    line = one_error_line(result)
    assert not CONTROL.search(result.stderr) and "\\x1b]0;PWN\\x07" in line


def test_the_server_log_shows_a_clients_control_characters_as_escapes(capfd):
    """serve.LOGGING's handler and formatter, on the loggers it routes (not through dictConfig, which
    would close every handler of this process, pytest's own among them)."""
    from taskformer.app import serve

    routed = {name: spec["handlers"] for name, spec in serve.LOGGING["loggers"].items()}
    assert routed == {"uvicorn": ["stderr"], "asyncio": ["stderr"]}
    assert serve.LOGGING["handlers"]["stderr"]["formatter"] == "lines"
    handler = serve.Stderr()
    handler.setFormatter(serve.LogLines(serve.LOGGING["formatters"]["lines"]["fmt"]))
    loggers = [logging.getLogger(name) for name in routed]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        logging.getLogger("uvicorn.error").warning("a client sent %s", HOSTILE)
        logging.getLogger("asyncio").error("a task failed on %s", HOSTILE)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert err.count("\\x1b]0;PWN\\x07") == 2 and not CONTROL.search(err), err


# -- each record states what actually ran ---------------------------------------------------------------

COPY = ["--quiet", "--set", "data.train_size=8", "--set", "data.val_size=4", "--set", "data.test_size=4",
        "--set", "data.length=4", "--set", "train.bf16=false"]
STUDENT = ["--quiet", "--set", "train.epochs=0", "--set", "train.max_steps=1"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "run"
    result = run_here("run", "copy", "--out", str(out), *COPY, "--set", "train.epochs=0", "--set", "train.max_steps=4")
    assert result.returncode == 0, result.stderr
    return out


@SLOW
def test_a_sampling_teacher_is_recorded_as_sampling_not_greedy(teacher, tmp_path):
    out = tmp_path / "student"
    result = run_here("distill", str(teacher), "--out", str(out), *STUDENT, "--teacher-set", "decode.temperature=0.9",
                      "--teacher-set", "decode.seed=7")
    assert result.returncode == 0, result.stderr
    search = json.loads((out / "result.json").read_text())["info"]["distill"]["teacher_search"]
    assert search["strategy"] == "sample" and search["temperature"] == 0.9 and search["seed"] == 7, search
    assert "beam" not in search
    report = re.sub(r"[\s│]+", " ", (out / "report.txt").read_text())  # a table's cell, wrapped or not
    said = report.split("distilled from")[1][:300]
    assert "sampled at temperature 0.9" in said and "seed 7" in said and "greedy" not in said, said


# -- requests are bounded, and every option in range gives an answer ---------------------------------------

@SLOW
def test_sampling_at_the_ends_of_its_ranges_gives_an_answer_not_nan(lm_run):
    import taskformer

    model = taskformer.load(lm_run)
    greedy = model.predict(["said"], temperature=1.0, top_k=1, max_new_tokens=8)
    assert model.predict(["said"], temperature=1e-300, max_new_tokens=8) == greedy  # as cold as it gets: greedy
    assert model.predict(["said"], temperature=1.0, top_p=1e-300, max_new_tokens=8) == greedy  # the top token only
    for extreme in ({"temperature": 1e308}, {"temperature": 5e-324, "top_p": 5e-324}, {"temperature": 1e308, "top_k": 2}):
        [out] = model.predict(["said"], max_new_tokens=8, **extreme)
        assert isinstance(out, str), extreme


@SLOW
def test_max_new_tokens_has_an_upper_bound_on_the_command_line(lm_run):
    result = run_here("predict", str(lm_run), "said", "--set", "decode.max_new_tokens=1000000000")
    one_error_line(result, "max_new_tokens", "100000")


@SLOW
def test_the_server_bounds_a_requests_length_and_refuses_a_per_request_compile(lm_run):
    pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
    from fastapi.testclient import TestClient

    import taskformer.app.runner as runner
    from taskformer.app.server import Limits, create_app

    app = create_app({"lm": runner.load(lm_run)}, Limits())
    with TestClient(app) as client:
        def ask(**options):
            return client.post("/v1/models/lm/predict", json={"inputs": ["said"], **options})

        for field, options in (("max_new_tokens", {"max_new_tokens": 1_000_000_000}),
                               ("compile", {"compile": True, "max_new_tokens": 4})):
            answer = ask(**options)
            assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
        for options in ({"temperature": 1e-300}, {"temperature": 1e308}, {"top_p": 1e-300, "temperature": 1.0}):
            answer = ask(max_new_tokens=4, **options)
            assert answer.status_code == 200, (options, answer.text)
        assert "compile" not in client.get("/v1/models").json()["models"][0]["options"]


@SLOW
def test_a_client_that_leaves_a_stream_writes_no_traceback_in_the_server_log(lm_run):
    httpx = pytest.importorskip("httpx", reason="the serve tests need the test extra")
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-m", "taskformer", "serve", f"lm={lm_run}", "--port", "0",
                               "--set", "decode.max_new_tokens=20000"], stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://[\d.]+:\d+", server.stderr.readline()).group(0)
        with httpx.Client(base_url=url, timeout=60) as client:
            for _ in range(10):
                with client.stream("POST", "/v1/models/lm/predict/stream", json={"inputs": ["said"]}) as stream:
                    next(stream.iter_lines())  # the first piece, then the client leaves
            assert client.get("/health").status_code == 200
            assert client.post("/v1/models/lm/predict", json={"inputs": ["said"], "max_new_tokens": 3}).status_code == 200
    finally:
        server.terminate()
        _, log = server.communicate(timeout=60)
    assert "Traceback" not in log and "CancelledError" not in log and "socket.send" not in log, log
    assert len(log.splitlines()) <= 3, log


# -- words that tell the truth ------------------------------------------------------------------------------

def test_a_token_budget_is_never_rounded_up_past_what_it_holds():
    from taskformer.core.budget import tokens

    assert tokens(19_960_000) == "19.9 M" and tokens(20_000_000) == "20 M"  # below a 20 M row: said so
    assert [tokens(n) for n in (850_000, 1_234, 999, 1_500_000_000)] == ["850 k", "1.23 k", "999", "1,500 M"]


@SLOW
def test_the_dry_run_counts_one_update_in_the_singular(tmp_path):
    result = run_here("run", "shakespeare-char", "--data-dir", str(text_dir(tmp_path, TEXT)), *LM,
                      "--set", "train.max_steps=1", "--set", "train.max_tokens=4096", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "at most 1 update (train.max_steps)" in result.stdout and "planned 1 update," in result.stdout
    assert "epochs of 1 update)" in result.stdout, result.stdout


@pytest.mark.parametrize("dry", [False, True])
@SLOW
def test_more_processes_than_cores_is_refused_at_once(tmp_path, dry):
    cores = len(os.sched_getaffinity(0))
    out = tmp_path / "run"
    result = run_cli("run", "copy", "--out", str(out), "--quiet", "--nproc", str(cores + 1),
                     *(["--dry-run"] if dry else []), env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    one_error_line(result, f"--nproc {cores + 1}", f"at most --nproc {cores}")
    assert not out.exists()


@pytest.mark.parametrize("setting, words", [(["--seed", "5"], ["--seed 5", "draws its data from the seed"]),
                                            (["--set", "model.d_model=65536"], ["model.d_model"])])
@SLOW
def test_a_distillation_is_refused_before_the_teachers_decode(teacher, tmp_path, setting, words):
    out = tmp_path / "student"
    result = run_here("distill", str(teacher), "--out", str(out), *STUDENT, *setting)
    one_error_line(result, *words)
    assert not out.exists() and "decoding the train split" not in result.stderr


# -- an intended stop is no error, and the record keeps it ----------------------------------------------------

@SLOW
def test_ctrl_c_of_a_run_says_how_to_resume_and_the_resumed_run_records_it(tmp_path):
    import signal

    from test_robustness import start, wait_for_checkpoint

    out = tmp_path / "run"
    proc = start("run", "copy", "--out", str(out), "--quiet", "--set", "data.train_size=600", "--set", "train.epochs=2",
                 "--set", "train.save_every=2", "--set", "data.val_size=8", "--set", "data.test_size=8")
    wait_for_checkpoint(out, 4, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Error:" not in err and "Traceback" not in err, err
    assert "training interrupted by SIGINT" in err and f"Resume with: taskformer run --resume {out}" in err
    resumed = run_here("run", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    [record] = json.loads((out / "result.json").read_text())["info"]["resumed"]
    assert record["after"] == "interrupted by SIGINT" and record["step"] >= 4
    assert f"resuming after update {record['step']:,} (epoch {record['epoch'] + 1}" in resumed.stderr
    assert "it had stopped: interrupted by SIGINT" in re.sub(r"[\s│]+", " ", (out / "report.txt").read_text())


@SLOW
@pytest.mark.parametrize("inherited", ["default", "ignored"])  # a shell's background job inherits SIGINT ignored
def test_ctrl_c_of_serve_is_a_calm_stop(lm_run, inherited):
    import signal
    import subprocess
    import sys

    handler = signal.SIG_IGN if inherited == "ignored" else signal.SIG_DFL
    server = subprocess.Popen([sys.executable, "-m", "taskformer", "serve", f"lm={lm_run}", "--port", "0"],
                              stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, handler))
    try:
        assert "serving lm on" in server.stderr.readline()
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 130 and err.strip().splitlines() == ["stopped serving (Ctrl-C)"], err
