"""``taskformer distill``: a teacher run decodes its train sources, a student run learns those outputs.

The teacher is a copy run stopped after a few updates, so its outputs are not the references: a
student that writes them learnt from the teacher, not from the data."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_hostile import one_error

import taskformer
from conftest import run_here

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

DATA = ["--set", "data.train_size=8", "--set", "data.val_size=4", "--set", "data.test_size=4",
        "--set", "data.length=4", "--set", "train.bf16=false"]  # fp32: the same outputs on any CPU
# One evaluation, after the last update: the student's val score is against the references, which it
# does not learn, so an earlier evaluation would be kept as its best.
STUDENT = ["--quiet", "--set", "train.epochs=0", "--set", "train.max_steps=60", "--set", "train.eval_every=60",
           "--set", "train.lr=3e-3", "--set", "train.warmup=10", "--set", "train.bf16=false"]
TINY_STUDENT = ["--quiet", "--set", "train.epochs=0", "--set", "train.max_steps=1"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A finished copy run of a few updates: it writes partial copies of varied lengths, not the copies."""
    out = tmp_path_factory.mktemp("teacher") / "run"
    result = run_here("run", "copy", "--out", str(out), "--quiet", *DATA, "--set", "train.epochs=0",
                      "--set", "train.max_steps=12", "--set", "train.eval_every=12", "--set", "train.warmup=5",
                      "--set", "train.lr=3e-3")
    assert result.returncode == 0, result.stderr
    return out


def targets(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "distill-train.jsonl").read_text(encoding="utf-8").splitlines()]


def predicted(cli, run_dir: Path, sources: list[str]) -> list[str]:
    result = cli("predict", str(run_dir), input="".join(s + "\n" for s in sources))
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_the_student_writes_the_teachers_outputs_not_the_references(teacher, cli, tmp_path):
    out = tmp_path / "student"
    result = cli("distill", str(teacher), "--out", str(out), *STUDENT, "--set", "distill.mix=false")
    assert result.exit_code == 0, result.output
    rows = targets(out)
    sources, taught = [r["source"] for r in rows], [r["output"] for r in rows]
    assert len(rows) == 8 and not (out / "distill-decoding.jsonl").exists()
    assert taught == predicted(cli, teacher, sources)  # the teacher's own search
    assert sum(r["output"] != r["reference"] for r in rows) >= 4  # an under-trained teacher
    assert len(set(taught)) >= 4  # whose outputs follow their sources: more than one answer to learn
    assert predicted(cli, out, sources) == taught

    info = json.loads((out / "result.json").read_text())["info"]
    assert info["distill"]["teacher"] == str(teacher.absolute())
    assert (info["distill"]["count"], info["distill"]["file"], info["distill"]["mix"]) == (8, "distill-train.jsonl",
                                                                                          False)
    assert info["data"]["train"] == 8
    assert "distilled from" in (out / "report.txt").read_text()
    assert taskformer.load(out).evaluate("test")  # a normal run


def test_by_default_the_student_trains_on_the_references_beside_the_teachers_outputs(teacher, cli, tmp_path):
    out = tmp_path / "student"
    result = cli("distill", str(teacher), "--out", str(out), *TINY_STUDENT)
    assert result.exit_code == 0, result.output
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["distill"]["mix"] is True and info["data"]["train"] == 16


class InterruptDecoding:
    """Counts the teacher's decoding batches (its search was given batches of one row; the student's
    are larger) and raises KeyboardInterrupt, as a Ctrl-C would, in the ``nth``; every batch is left
    to the task's decoder."""

    def __init__(self, nth: int):
        self.nth, self.calls = nth, 0

    @taskformer.hookimpl
    def taskformer_decode(self, config):
        if config.decode.batch_size == 1:
            self.calls += 1
            if self.calls == self.nth:
                raise KeyboardInterrupt


def test_an_interrupted_decode_resumes_to_the_data_of_an_uninterrupted_one(teacher, cli, register, tmp_path):
    search = ["--teacher-set", "decode.batch_size=1", "--teacher-set", "decode.workers=1"]  # 8 blocks of one row
    plugin = register(InterruptDecoding(nth=4), "interrupt-decoding")
    out = tmp_path / "student"
    result = cli("distill", str(teacher), "--out", str(out), *search, *TINY_STUDENT)
    assert result.exit_code == 130, result.output
    assert f"3 of 8 teacher outputs are saved. Resume with: taskformer distill --resume {out}" in result.stderr
    decoding = out / "distill-decoding.jsonl"
    assert len(decoding.read_text().splitlines()) == 3
    assert not (out / "distill-train.jsonl").exists() and not (out / "config.json").exists()
    with decoding.open("a") as f:  # and a fourth row's line that a kill cut short
        f.write('{"row": 3, "outp')

    plugin.nth, plugin.calls = 0, 0
    assert cli("distill", "--resume", str(out), "--quiet").exit_code == 0
    assert plugin.calls == 5  # the rows left, not the whole split again
    straight = tmp_path / "straight"
    assert cli("distill", str(teacher), "--out", str(straight), *search, *TINY_STUDENT).exit_code == 0
    assert (out / "distill-train.jsonl").read_text() == (straight / "distill-train.jsonl").read_text()
    assert not decoding.exists() and (out / "result.json").exists()


def test_run_resume_of_a_student_reads_the_teachers_outputs(teacher, cli, tmp_path):
    out = tmp_path / "student"
    assert cli("distill", str(teacher), "--out", str(out), *TINY_STUDENT).exit_code == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["distill"]["file"] == "distill-train.jsonl"
    (out / "distill-train.jsonl").write_text("")  # the student's train split is this file, resumed or not
    (out / "result.json").unlink()
    one_error(cli("run", "--resume", str(out), "--quiet"), "distill-train.jsonl", "0 teacher outputs")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A two-member agnews ensemble of a few updates: unsure of every text, and wrong about many."""
    out = tmp_path_factory.mktemp("agnews") / "run"
    fixture = Path(__file__).parent / "data" / "ag_news"
    result = run_here("run", "agnews", "--data-dir", str(fixture), "--out", str(out), "--quiet",
                      "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.enc_layers=1",
                      "--set", "model.d_ff=64", "--set", "model.members=2", "--set", "data.vocab_size=300",
                      "--set", "train.epochs=0", "--set", "train.max_steps=20", "--set", "train.lr=3e-3",
                      "--set", "train.bf16=false")
    assert result.returncode == 0, result.stderr
    return out


def test_a_classifier_student_learns_its_teachers_label_distribution(classifier, cli, tmp_path):
    out = tmp_path / "student"
    result = cli("distill", str(classifier), "--out", str(out), "--set", "model.members=1", "--set",
                 "distill.mix=false", "--set", "train.label_smoothing=0", *STUDENT)
    assert result.exit_code == 0, result.output
    rows = targets(out)
    sources, references = [r["source"] for r in rows], [r["reference"] for r in rows]
    taught = [r["output"] for r in rows]
    labels = ["World", "Sports", "Business", "Sci/Tech"]
    assert all(sorted(p) == sorted(labels) and abs(sum(p.values()) - 1) < 1e-4 for p in taught)
    best = [max(p, key=p.get) for p in taught]
    said = [line.split("\t") for line in predicted(cli, classifier, sources)]  # the teacher's label, its probability
    assert [label for label, _ in said] == best
    assert all(abs(float(p) - t[label]) < 1e-3 for (label, p), t in zip(said, taught))
    assert sum(b != r for b, r in zip(best, references)) >= len(rows) / 3  # so what the student says is the teacher's
    assert max(max(p.values()) for p in taught) < 0.9  # and unsure: soft targets, far from one-hot

    student = [line.split("\t") for line in predicted(cli, out, sources)]
    assert sum(label == b for (label, _), b in zip(student, best)) >= 0.9 * len(rows)
    gap = sum(abs(float(p) - t[label]) for (label, p), t in zip(student, taught)) / len(rows)
    assert gap < 0.1  # as unsure as its teacher, where a student of one-hot labels would grow nearly sure
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["distill"]["teacher_search"] == {"strategy": "distribution", "temperature": 1.0}
    assert info["distill"]["teacher_members"] == 2
    report = " ".join((out / "report.txt").read_text().replace("│", " ").split())  # as one line, unwrapped
    assert "(2 members): its label distributions for the 152 train sources" in report

    # A second word-dropped copy of train for the teacher to label, one source at a time: the first
    # copy's outputs are as before, as a resumed decode's are (no output depends on its batch).
    more = tmp_path / "more"
    assert cli("distill", str(classifier), "--out", str(more), "--teacher-set", "decode.batch_size=1",
               "--set", "data.augment=2", *TINY_STUDENT).exit_code == 0
    assert len(targets(more)) == len(rows) * 3 // 2 and [r["output"] for r in targets(more)][: len(rows)] == taught

    softer = tmp_path / "softer"  # temperature 2: softmax(log p / 2)
    assert cli("distill", str(classifier), "--out", str(softer), "--set", "distill.temperature=2",
               *TINY_STUDENT).exit_code == 0
    for p, q in zip(taught, [r["output"] for r in targets(softer)]):
        roots = {label: math.sqrt(x) for label, x in p.items()}
        assert all(abs(q[label] - root / sum(roots.values())) < 1e-4 for label, root in roots.items())


@pytest.mark.parametrize("damage", ["missing", "empty", "not a run", "unfinished"])
def test_a_missing_or_invalid_teacher_is_refused(teacher, cli, tmp_path, damage):
    import shutil

    given = tmp_path / "teacher"
    if damage == "empty":
        given.mkdir()
    elif damage == "not a run":
        given.mkdir()
        (given / "config.json").write_text("[1, 2]")
    elif damage == "unfinished":
        shutil.copytree(teacher, given)
        (given / "result.json").unlink()
    expected = {"missing": "no such run directory", "empty": "config.json", "not a run": "not a taskformer run",
                "unfinished": "has not finished"}[damage]
    one_error(cli("distill", str(given), "--out", str(tmp_path / "student"), "--quiet"), str(given), expected)
    assert not (tmp_path / "student").exists()


def test_a_non_empty_out_is_refused_and_left_as_it_was(teacher, cli, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    one_error(cli("distill", str(teacher), "--out", str(out), "--quiet"), str(out), "not empty")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("args, named", [
    (["--set", "distill.mixx=true"], "distill.mixx"),
    (["--set", "distill.mix=maybe"], "distill.mix"),
    (["--set", "train.lrr=1"], "train.lrr"),
    (["--teacher-set", "train.lr=1"], "--teacher-set"),
    (["--set", "distill.temperature=0"], "distill.temperature"),
    (["--set", "distill.temperature=2"], "distill.temperature"),  # a copy teacher has no probabilities to soften
])
def test_bad_settings_are_refused_before_the_decode(teacher, cli, tmp_path, args, named):
    one_error(cli("distill", str(teacher), "--out", str(tmp_path / "student"), "--quiet", *args), named)
    assert not (tmp_path / "student").exists()


def test_resume_takes_no_other_settings(cli, tmp_path):
    one_error(cli("distill", "--resume", str(tmp_path), "--seed", "0"), "--resume", "--seed")
    one_error(cli("distill", "--resume", str(tmp_path)), "no distill.json")
