"""The Python API: docs/api.md's example runs as written, and loading refuses what the CLI refuses."""
import re
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import taskformer
from conftest import run_cli, run_here

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

DOC = Path(__file__).parents[1] / "docs" / "api.md"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, default_copy_run):
    """A folder holding runs/copy/example, the run the documentation's example loads."""
    root = tmp_path_factory.mktemp("api")
    shutil.copytree(default_copy_run[0], root / "runs" / "copy" / "example")
    return root


def test_the_documented_example_prints_what_its_comments_say(workdir, monkeypatch, capsys):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    expected = [line.split("# -> ", 1)[1].strip() for line in code.splitlines() if "# -> " in line]
    assert len(expected) >= 4
    monkeypatch.chdir(workdir)
    exec(compile(code, str(DOC), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == expected


def test_predict_matches_the_command_line_and_prints_nothing(workdir, capsys):
    run_dir = workdir / "runs" / "copy" / "example"
    texts = ["3 1 4 1 5 9 2 6 5 3", "2 7 1 8 2 8 1 8 2 8"]
    model = taskformer.load(run_dir)
    ours = model.predict(texts, beam=1)
    assert capsys.readouterr().out == ""
    cli = run_cli("predict", str(run_dir), "--beam", "1", input="\n".join(texts) + "\n")
    assert cli.returncode == 0 and cli.stdout.splitlines() == ours
    assert model.predict([]) == []


def test_the_tokenizer_is_the_runs_own(finished):
    run_dir = finished  # a tiny run: the tokenizer does not depend on how well its model learnt
    text = "3 1 4 1 5 9 2 6"
    own = Tokenizer.from_file(str(run_dir / "tokenizer.json")).encode(text).ids
    assert taskformer.load(run_dir).tokenizer.encode(text).ids == own and own


@pytest.mark.parametrize("call, message", [
    (lambda m: m.predict("1 2 3"), "not one string"),
    (lambda m: m.predict([1, 2]), r"texts\[0\] must be a string, got int"),
    (lambda m: m.predict(["1 2", None]), r"texts\[1\] must be a string, got NoneType"),
    (lambda m: m.predict(None), "texts must be a list of strings"),
    (lambda m: m.predict(["1 2", "\udcff"]), r"texts\[1\] is not valid unicode"),  # was a raw TypeError
    (lambda m: m.predict(["1 2"], beam=0), "beam must be"),
    (lambda m: m.evaluate("train"), "unknown split"),
])
def test_bad_calls_raise_a_taskformer_error(workdir, call, message):
    model = taskformer.load(workdir / "runs" / "copy" / "example")
    with pytest.raises(taskformer.TaskformerError, match=message):
        call(model)


@pytest.mark.parametrize("run_dir", [None, 3])
def test_load_names_a_run_dir_that_is_not_a_path(run_dir):
    with pytest.raises(taskformer.TaskformerError, match="load: run_dir must be a path"):
        taskformer.load(run_dir)


def test_loading_refuses_a_planted_pickle_with_the_cli_message(workdir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(workdir / "runs" / "copy" / "example", bad)
    (bad / "evil.pkl").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(taskformer.TaskformerError) as raised:
        taskformer.load(bad)
    cli = run_here("predict", str(bad), "1 2 3")
    assert cli.returncode == 2 and cli.stderr.strip() == f"Error: {raised.value}"

