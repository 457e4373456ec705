"""Robustness, round five's remaining cases: each record states what ran (predict's search, a compile
that failed), damaged run and cache files, a language model's report samples, a CSV the reader cannot
parse, and a full disk while a run writes -- one ``Error:`` line naming the file, never a traceback,
never lost work."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_prepared_data import plugin  # noqa: F401 (a fixture: the prepared-reverse task)
from test_robustness import json_paths, replaced

from conftest import TINY

# -- each record states what ran -------------------------------------------------------------------------------


def test_predict_json_states_the_search_that_ran_with_its_options(cli, finished):
    """``predict --json --beam 2`` (or ``--set decode.temperature``) changed the search, and nothing
    said so: an encoder-decoder's outputs are bare strings and stderr named the engine alone."""
    def search(*options):
        result = cli("predict", str(finished), "1 2 3", "--json", *options)
        assert result.exit_code == 0, result.output
        return json.loads(result.stderr.split("search: ", 1)[1].splitlines()[0])

    beam = search("--beam", "2")
    assert (beam["strategy"], beam["beam"]) == ("beam", 2)
    sampled = search("--set", "decode.temperature=0.5", "--set", "decode.seed=4")
    assert (sampled["strategy"], sampled["temperature"], sampled["seed"]) == ("sample", 0.5, 4)


@pytest.fixture
def failing_compiler(monkeypatch):
    """A compiler that fails at the first step, as Inductor does without a C++ compiler."""
    import torch

    def compiled(fn, **_):
        def step(*args, **kwargs):
            raise RuntimeError("no C++ compiler here")
        return step

    monkeypatch.setattr(torch, "compile", compiled)


def test_a_compile_that_failed_is_recorded_as_decoding_without_it(cli, finished, tmp_path, failing_compiler):
    """``decode.compile=true`` whose compiler failed decodes without it (a warning says so), but the
    run's record and eval's search said only what was asked for."""
    evaluated = cli("eval", str(finished), "--split", "val", "--json", "--set", "decode.compile=true",
                    "--set", "decode.engine=torch")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["search"]["compile"].startswith("failed (RuntimeError: no C++ compiler here)")
    out = tmp_path / "run"
    ran = cli("run", "copy", "--out", str(out), *TINY, "--set", "decode.compile=true")
    assert ran.exit_code == 0, ran.output
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["compile"] == "failed (RuntimeError: no C++ compiler here); decoded without it", info


# -- a run's files truncated, swapped in from another run, or a value given another type ----------------------

RUN_FILES = ["result.json", "config.json", "metrics.jsonl", "model.safetensors", "tokenizer.json"]
COMMANDS = ["report", "predict", "eval", "runs", "serve", "resume"]


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second tiny copy run of the same shape: the files a swap takes."""
    from conftest import run_cli

    out = tmp_path_factory.mktemp("other") / "run"
    assert run_cli("run", "copy", "--out", str(out), *TINY, "--seed", "5").returncode == 0
    return out


def retyped(value, draw):
    """``value`` with one scalar inside given another type: a string where a number is, a number where a string."""
    places = [p for p in json_paths(value) if p and isinstance(leaf(value, p), (str, int, float, bool))]
    if not places:
        return 7
    where = draw(st.sampled_from(places))
    old = leaf(value, where)
    return replaced(value, where, 7 if isinstance(old, str) else str(old))


def leaf(value, path):
    for key in path:
        value = value[key]
    return value


def damage(path, how, other_run, draw) -> None:
    raw = path.read_bytes()
    if how == "truncated":
        path.write_bytes(raw[: draw(st.integers(0, max(len(raw) - 1, 0)))])
    elif how == "swapped":
        path.write_bytes((other_run / path.name).read_bytes())
    elif path.suffix == ".safetensors":  # a tensor's dtype in the header: one of the same width, another type
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + size])
        name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        header[name]["dtype"] = "I32" if header[name]["dtype"] == "F32" else "I16"
        text = json.dumps(header, separators=(",", ":")).encode()
        text = text.ljust(size) if len(text) <= size else text  # padded as safetensors pads its header
        path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size:])
    elif path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = json.dumps(retyped(json.loads(lines[at]), draw))
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(json.dumps(retyped(json.loads(raw), draw)))


def command_line(command: str, run, port: int) -> list[str]:
    return {"report": ["report", str(run)], "predict": ["predict", str(run), "1 2 3"],
            "eval": ["eval", str(run), "--split", "val"], "runs": ["runs", str(run.parent)],
            "serve": ["serve", str(run), "--port", str(port)], "resume": ["run", "--resume", str(run), "--quiet"]}[command]


@pytest.mark.slow  # each example runs a command on a copied run
@settings(max_examples=24, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(RUN_FILES), how=st.sampled_from(["truncated", "swapped", "retyped"]),
       command=st.sampled_from(COMMANDS), data=st.data())
def test_a_run_file_truncated_swapped_or_retyped_is_read_or_named_in_one_line(finished, other, cli, tmp_path_factory,
                                                                              name, how, command, data):
    import shutil
    import socket


    run = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(finished, run)
    if command == "resume" and name != "result.json":
        (run / "result.json").unlink()  # a finished run is not resumed
    damage(run / name, how, other, data.draw)
    before = {p.relative_to(run) for p in run.rglob("*")}
    with socket.socket() as taken:  # serve loads its runs, then cannot listen here: it never serves
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = cli(*command_line(command, run, taken.getsockname()[1]))
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    if command == "runs":  # a damaged run is skipped with a warning naming its file, never the whole listing
        assert result.exit_code == 0, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    if result.exit_code == 2 and not (command == "serve" and "--host/--port" in result.stderr):
        assert len(errors) == 1 and str(run) in errors[0], result.stderr
        assert before <= {p.relative_to(run) for p in run.rglob("*")}  # a refusal removes nothing


# -- a data cache entry's files truncated, swapped in from another entry, or retyped: the entry is made again ---

@pytest.fixture
def two_entries(cli, plugin, reverse_data, cache, tmp_path):  # noqa: F811 (the fixture)
    """A cache holding the entries of two runs (seeds 1 and 4), and what the first run learned."""
    from test_prepared_data import entries, run, trained

    run(cli, reverse_data, tmp_path / "a")
    [first] = entries(cache)
    run(cli, reverse_data, tmp_path / "b", "--seed", "4")
    [second] = [e for e in entries(cache) if e != first]
    return (first, second), trained(tmp_path / "a")


@pytest.mark.slow  # each example trains a few updates through the command line
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(how=st.sampled_from(["truncated", "swapped", "retyped", "emptied"]), data=st.data())
def test_a_cache_file_truncated_swapped_or_retyped_is_made_again(cli, plugin, reverse_data, cache, two_entries,  # noqa: F811
                                                                  tmp_path_factory, monkeypatch, how, data):
    import shutil

    from test_prepared_data import run, trained, warnings_of

    (first, second), learned = two_entries
    copy = tmp_path_factory.mktemp("cache")
    shutil.copytree(cache, copy, dirs_exist_ok=True, symlinks=True)
    monkeypatch.setenv("TASKFORMER_CACHE", str(copy))
    entry = copy / "data" / first.name
    files = sorted(p.relative_to(entry) for p in entry.rglob("*") if p.is_file()
                   and (how != "retyped" or p.suffix == ".json")
                   and (how != "swapped" or (second / p.relative_to(entry)).exists()))
    path = entry / data.draw(st.sampled_from(files))
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: data.draw(st.integers(0, max(path.stat().st_size - 1, 0)))])
    elif how == "swapped":
        path.write_bytes((copy / "data" / second.name / path.relative_to(entry)).read_bytes())
    elif how == "emptied":
        path.write_bytes(b"")
    else:
        path.write_text(json.dumps(retyped(json.loads(path.read_text()), data.draw)))
    out = tmp_path_factory.mktemp("again") / "run"
    result = run(cli, reverse_data, out)  # exit 0, no traceback
    assert len(warnings_of(result)) <= 1, result.stderr
    assert trained(out) == learned  # the entry read or made again, never another seed's rows


def test_a_cache_entry_whose_data_json_holds_another_type_is_made_again(cli, plugin, reverse_data, cache,  # noqa: F811
                                                                         two_entries, tmp_path):
    """A val row's source given as a number passed the cache's checks and ended the run in an internal
    ``TypeError`` (the fuzz above found it)."""
    from test_prepared_data import run, trained, warnings_of

    (entry, _), learned = two_entries
    saved = json.loads((entry / "data.json").read_text())
    saved["splits"]["val"][0][0] = 7
    (entry / "data.json").write_text(json.dumps(saved))
    result = run(cli, reverse_data, tmp_path / "again")
    assert trained(tmp_path / "again") == learned
    assert [w for w in warnings_of(result) if "data.json is not what the cache writes" in w], result.stderr


# -- a language model's report samples, as they ran ------------------------------------------------------------

def test_a_language_models_report_samples_show_whole_distinct_prompts_as_the_model_read_them(tmp_path):
    """The held-out text began inside a line, whose tail (``?``) was a prompt; two paragraphs that begin
    alike gave two identical rows; a prompt's characters outside the vocabulary went unmentioned; a
    continuation's line breaks looked like the table's own wrapping."""
    from test_robustness_five import LM, text_dir

    from conftest import run_cli
    from taskformer.app import report, runner

    val = "?\n\nROMEO:\nyes\n\nROMEO:\nno\n\nZoë:\nhi\n\n"
    line = "Line 1: a small play, said twice\n"
    train = (line * 100)[: 3 * len(val) - 1] + "x"  # three quarters of the text, ending inside a line
    data = text_dir(tmp_path, train + val)
    out = tmp_path / "lm"
    ran = run_cli("run", "shakespeare-char", "--data-dir", str(data), "--out", str(out), *LM,
                  "--set", "data.val_fraction=0.25", "--set", "decode.max_new_tokens=40")
    assert ran.returncode == 0, ran.stderr
    [table] = [part for title, part in report.sections(runner.load(out)) if title == "Samples"]
    prompts, continuations = ([str(cell) for cell in column.cells] for column in table.columns)

    def unknown(prompt):
        return " ".join(c for c in dict.fromkeys(prompt) if c not in train)

    assert prompts == [f"ROMEO:\n(read as [UNK]: {unknown('ROMEO:')})", f"Zoë:\n(read as [UNK]: {unknown('Zoë:')})"]
    assert all("\n" not in cell.replace("↵\n", "") for cell in continuations), continuations
    assert "↵ marks a line break" in str(table.caption)


# -- a CSV that pandas cannot parse: our words, the file and the line ------------------------------------------

@pytest.mark.parametrize("body, said", [
    ('text,label\n"never closed,a\nfoo,b\n',  # was: Error tokenizing data. C error: EOF inside string starting at row 1
     'train.csv:2: a quoted cell that is never closed (a " that opens a cell runs to the end of the file)'),
    ("text,label\nfoo,b\nx,y,z,w\nbar,c\n",  # was: Error tokenizing data. C error: Expected 2 fields in line 3, saw 4
     "train.csv:3: 4 cells where the first line has 2 (a separator too many, or a cell to quote)"),
    ("text,label\nhello world,a,extra\nbye,b\n",  # was: read with "hello world" as an index, every column shifted
     "train.csv:2: 3 cells where the first line has 2 (a separator too many, or a cell to quote)"),
])
def test_a_csv_that_cannot_be_parsed_is_named_with_its_line_in_our_words(tmp_path, body, said):
    from conftest import task_data
    from taskformer.core.errors import TaskformerError

    path = tmp_path / "train.csv"
    path.write_text(body)
    with pytest.raises(TaskformerError) as refused:
        task_data("classify", path)
    assert str(refused.value) == f"{tmp_path / said}", str(refused.value)


def test_a_first_row_wider_than_the_column_names_given_is_refused_not_shifted(tmp_path):
    from conftest import task_data
    from taskformer.core.errors import TaskformerError

    path = tmp_path / "train.csv"
    path.write_text("hello world,a,extra\nbye,b\n")
    with pytest.raises(TaskformerError, match=r"train.csv:1: 3 cells where the column names given are 2"):
        task_data("classify", path, "data.columns=text,label")


# -- a disk that fills while a run writes: one Error line, exit 2, the previous files intact ------------------

@pytest.fixture
def full_at(monkeypatch):
    """``full_at(PART)``: the disk fills when a file whose path holds PART is written (the fsync of its
    atomic write fails with ENOSPC, as on a disk whose blocks are allocated when the data is flushed)."""
    import errno
    import os

    sync = os.fsync

    def fill(part):
        def fsync(fd):
            if part in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return sync(fd)
        monkeypatch.setattr(os, "fsync", fsync)
    return fill


@pytest.mark.parametrize("part", [".result.json.", ".outputs-val.jsonl.", ".model.safetensors.", "/.tmp-",
                                  ".report.html."], ids=["result", "outputs", "best weights", "checkpoint", "report"])
def test_a_disk_that_fills_as_a_run_writes_is_one_error_and_the_run_goes_on_from_what_is_intact(
        cli, tmp_path, full_at, monkeypatch, part):
    """The best weights and a checkpoint's files were renamed into place without an fsync: a disk that
    fills as the data is flushed failed after the rename (and a crash could publish an empty file)."""
    out = tmp_path / "run"
    full_at(part)
    result = cli("run", "copy", "--out", str(out), *TINY)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert "No space left on device" in errors[0] or "no space left on" in errors[0], errors
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".tmp-")], \
        "a write cut short left its temporary file"
    monkeypatch.undo()
    if (out / "result.json").exists():  # the report failed: the run is finished, its report is made again
        assert "taskformer report" in errors[0] and cli("report", str(out)).exit_code == 0
    elif list((out / "checkpoints").glob("step-*")):  # the checkpoint is intact: the run resumes from it
        assert f"resume with: taskformer run --resume {out}" in errors[0], errors
        assert cli("run", "--resume", str(out), "--quiet").exit_code == 0
    else:  # nothing to resume: the same command starts it again
        assert f"--out {out}" in errors[0], errors
        assert cli("run", "copy", "--out", str(out), *TINY).exit_code == 0
    assert (out / "result.json").exists() and (out / "report.html").exists()


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry run"])
def test_a_full_disk_at_the_out_probe_refuses_the_run_before_any_work_and_names_out(cli, tmp_path, full_at, dry):
    """The write check of ``--out`` (a probe file, before the data is read) on a full disk: one error
    naming the folder and ``--out``, nothing created there, no probe file left behind."""
    out = tmp_path / "runs" / "run"
    out.parent.mkdir()
    full_at(".taskformer-probe.")
    result = cli("run", "copy", "--out", str(out), *TINY, *(["--dry-run"] if dry else []))
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert errors[0] == (f"Error: cannot write {out.parent} (No space left on device); --out must name a folder "
                         "that can be written"), errors
    assert list(out.parent.iterdir()) == [], "the refused run created or left a file"


def test_a_new_run_after_a_resume_in_the_same_process_records_its_own_precision(cli, tmp_path):
    """A resume pins the precision its run recorded, for the process: a new run after it (the API, a
    notebook) took that pin and recorded "..., as when the run started" though it had just started."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert cli("run", "copy", "--out", str(first), *TINY).exit_code == 0
    (first / "result.json").unlink()
    assert cli("run", "--resume", str(first), "--quiet").exit_code == 0
    assert "as when the run started" in json.loads((first / "result.json").read_text())["info"]["precision"]
    assert cli("run", "copy", "--out", str(second), *TINY).exit_code == 0
    assert "as when the run started" not in json.loads((second / "result.json").read_text())["info"]["precision"]


@pytest.mark.slow  # spawns a process: the file size limit binds a whole process
def test_a_report_larger_than_the_file_size_limit_is_one_error_and_the_earlier_report_stays(finished, tmp_path):
    """RLIMIT_FSIZE (``ulimit -f``) makes the write of report.html fail with EFBIG, as a full disk would:
    the report written before is left whole, with no temporary file beside it."""
    import resource
    import shutil
    import subprocess
    import sys

    run = shutil.copytree(finished, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    limit = (run / "report.txt").stat().st_size + 1000  # report.txt fits, report.html (its plots inline) does not
    assert (run / "report.html").stat().st_size > limit
    result = subprocess.run([sys.executable, "-m", "taskformer", "report", str(run)], capture_output=True, text=True,
                            timeout=300, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 2 and errors == [f"Error: cannot write {run} (File too large); once it can be "
                                                 f"written, make the report again: taskformer report {run}"], result.stderr
    assert (run / "report.html").read_bytes() == before["report.html"]
    assert sorted(p.name for p in run.iterdir() if p.is_file()) == sorted(before)  # no temporary file left
