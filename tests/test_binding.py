"""A run's task, tokenizer and weights belong together; `runs` lists every run whole; `eval` reads only
the split it scores; a Ctrl-C during validation does not wait for it (issue 18)."""
import fcntl
import json
import os
import shutil
import signal

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import taskformer
from conftest import DATA, TINY, run_here
from taskformer.app import runner

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's


def one_line_error(result, *expected):
    assert result.exit_code == 2, result.output
    assert all(e in result.stderr for e in expected), result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: ") and "internal error" not in errors[0], result.stderr


def edit_json(path, change):
    saved = json.loads(path.read_text())
    change(saved)
    path.write_text(json.dumps(saved))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second finished copy run of the same shape and tokenizer as ``finished``, another seed."""
    out = tmp_path_factory.mktemp("other") / "run"
    assert run_here("run", "copy", "--out", str(out), "--seed", "7", *TINY).returncode == 0
    return out


@pytest.fixture
def copied(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def test_a_config_renamed_to_another_task_of_the_same_shape_is_refused(copied, cli):
    # translate-de-en is an encoder-decoder too, and with its data options at their defaults the
    # copy model's shape, tokenizer and weights would load as a German-English translator.
    edit_json(copied / "config.json", lambda c: c.update(task="translate-de-en", config={**c["config"], "data": {}}))
    one_line_error(cli("predict", str(copied), "1 2 3"), "model.safetensors", "weights of task 'copy'",
                   "names task 'translate-de-en'")


@pytest.mark.parametrize("edit", [lambda c: c["config"]["model"].update(n_heads=1),
                                  lambda c: c["config"]["model"].update(dropout=0.5),
                                  lambda c: c.update(labels=["a", "b"])], ids=["n_heads", "dropout", "labels"])
def test_an_edited_architecture_or_label_list_is_refused(copied, cli, edit):
    # n_heads=1 loads into weights of the same shapes and changes every prediction; so would labels.
    edit_json(copied / "config.json", edit)
    one_line_error(cli("predict", str(copied), "1 2 3"), "config.json: its model section or labels are not the ones "
                   "model.safetensors was trained with")


def swap_pad_and_bos(path):
    text = path.read_text()
    path.write_text(text.replace('"[PAD]"', '"[TMP]"').replace('"[BOS]"', '"[PAD]"').replace('"[TMP]"', '"[BOS]"'))


@pytest.mark.parametrize("bound, expected", [(True, "not the tokenizer this run was trained with"),
                                             (False, "must map [PAD] to id 0")])
def test_a_swapped_tokenizer_is_refused(copied, cli, bound, expected):
    if not bound:  # a run from before the binding: the special ids are still checked
        edit_json(copied / "config.json", lambda c: c.pop("binding"))
    swap_pad_and_bos(copied / "tokenizer.json")
    for command in (["predict", str(copied), "1 2"], ["eval", str(copied), "--split", "test"], ["report", str(copied)]):
        one_line_error(cli(*command), "tokenizer.json", expected)


def test_weights_of_another_run_are_refused(copied, other, cli):
    (copied / "model.safetensors").unlink()
    (copied / "model.safetensors").symlink_to(other / "model.safetensors")
    one_line_error(cli("eval", str(copied)), "model.safetensors", "weights of another run")
    (copied / "result.json").unlink()  # unfinished: the run id is checked all the same
    one_line_error(cli("predict", str(copied), "1 2"), "model.safetensors", "weights of another run")


def test_weights_changed_after_the_run_finished_are_refused(copied, cli):
    weights = copied / "model.safetensors"
    with safe_open(weights, "pt") as f:  # the run's own stamp, kept: only the hash in result.json tells
        stamp, tensors = f.metadata(), {k: f.get_tensor(k) * 1.01 for k in f.keys()}
    save_file(tensors, weights, metadata=stamp)
    one_line_error(cli("predict", str(copied), "1 2"), "model.safetensors", "not the weights this run finished with")


def test_resume_refuses_a_checkpoint_of_another_run(copied, other, cli):
    (copied / "result.json").unlink()
    mine = sorted((copied / "checkpoints").glob("step-*"))[-1] / "model.safetensors"
    mine.unlink()
    shutil.copy(sorted((other / "checkpoints").glob("step-*"))[-1] / "model.safetensors", mine)
    before = (copied / "metrics.jsonl").read_text()
    one_line_error(cli("run", "--resume", str(copied), "--quiet"), str(mine), "weights of another run")
    assert (copied / "metrics.jsonl").read_text() == before  # refused before anything was touched


def test_runs_written_before_the_binding_still_load_with_a_warning(copied, cli):
    edit_json(copied / "config.json", lambda c: c.pop("binding"))
    edit_json(copied / "result.json", lambda r: r.pop("weights_sha256"))
    result = cli("predict", str(copied), "1 2 3")
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "written before" in result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_runs_lists_unfinished_and_running_runs_with_whole_paths_and_as_json(finished, tmp_path, cli):
    root = tmp_path / "runs"
    long = root / ("a-long-folder-name-" * 8) / "done"
    shutil.copytree(finished, long)
    for name in ("stopped", "training"):
        shutil.copytree(finished, root / name)
        (root / name / "result.json").unlink()
    export = root / "exported"  # another tool's config.json is not a run
    export.mkdir()
    (export / "config.json").write_text('{"layers": 3}')
    fd = os.open(root / "training", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running taskformer process holds on its run directory
    try:
        table, listed = cli("runs", str(root)), cli("runs", str(root), "--json")
    finally:
        os.close(fd)
    assert table.exit_code == 0 and listed.exit_code == 0, table.output + listed.output
    status = {r["path"]: r["status"] for r in json.loads(listed.stdout)}
    assert status == {str(long): "finished", str(root / "stopped"): "unfinished", str(root / "training"): "running"}
    done = next(r for r in json.loads(listed.stdout) if r["status"] == "finished")
    assert done["task"] == "copy" and done["metric"] == "exact_match" and "exact_match" in done["metrics"]["test"]
    lines = table.stdout.splitlines()  # CliRunner's output is not a terminal, as in a pipe: one line per run
    for path, state in status.items():
        assert any(path in line and state in line for line in lines), table.stdout


def test_eval_of_a_translate_run_reads_only_the_split_it_scores(cli, tmp_path):
    out = tmp_path / "run"
    tiny = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1", "model.d_ff=64",
            "model.max_len=48", "train.epochs=1", "train.max_tokens=600", "train.bf16=false", "data.vocab_size=200",
            "decode.beam=2"]
    result = cli("run", "translate-de-en", "--data-dir", str(DATA / "multi30k"), "--out", str(out), "--quiet",
                 *(x for o in tiny for x in ("--set", o)))
    assert result.exit_code == 0, result.output
    test_only = tmp_path / "test-only"
    test_only.mkdir()
    for name in ("test_2016_flickr.de.gz", "test_2016_flickr.en.gz"):
        shutil.copy(DATA / "multi30k" / name, test_only / name)
    result = cli("eval", str(out), "--data-dir", str(test_only), "--split", "test")
    assert result.exit_code == 0, result.output
    bleu = json.loads((out / "result.json").read_text())["metrics"]["test"]["bleu"]
    assert f"{bleu:.4g}" in result.stdout  # the saved tokenizer and weights score as the run did


TRAIN = ["--quiet", "--set", "data.train_size=40", "--set", "data.val_size=4", "--set", "data.test_size=4",
         "--set", "train.epochs=3", "--set", "train.log_every=1"]  # one update per epoch, each ends in a validation


class InterruptValidation:
    """Sends this process SIGINT from inside the ``nth`` validation (its metrics hook), as a Ctrl-C would."""

    def __init__(self, nth):
        self.nth, self.calls = nth, 0

    @taskformer.hookimpl
    def taskformer_metrics(self, references):
        self.calls += 1
        if self.calls == self.nth:
            os.kill(os.getpid(), signal.SIGINT)
        return {}


def test_the_first_interrupt_drops_a_validation_in_progress_and_the_run_resumes_exactly(cli, register, tmp_path):
    plugin = register(InterruptValidation(nth=2), "interrupt-validation")
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), *TRAIN)
    assert result.exit_code == 130, result.output
    assert "interrupted by SIGINT during validation" in result.stderr and f"--resume {out}" in result.stderr
    assert plugin.calls == 2  # the validation stopped inside; nothing after it ran
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == ["step-000000001"]  # the last one, whole
    assert not (out / "result.json").exists()
    plugin.nth = 0
    assert cli("run", "--resume", str(out), "--quiet").exit_code == 0
    assert cli("run", "copy", "--out", str(tmp_path / "straight"), *TRAIN).exit_code == 0
    resumed, straight = load_file(out / "model.safetensors"), load_file(tmp_path / "straight" / "model.safetensors")
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == \
           [json.loads(x)["step"] for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]


def test_a_second_interrupt_stops_at_once_during_a_validation_the_first_one_waits_for(register, tmp_path):
    # The first signal arrives during an update: training stops after it, once the evaluation due at
    # that step (train.eval_every) is done. A second signal during that evaluation stops now.
    sent = []

    def on_event(event):
        if event.get("event") == "train" and event["step"] == 2 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))

    class SecondSignal:
        @taskformer.hookimpl
        def taskformer_metrics(self):
            if sent:
                os.kill(os.getpid(), signal.SIGINT)

    register(SecondSignal(), "second-signal")
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        runner.train_task("copy", out=str(out), on_event=on_event, overrides=(
            "data.train_size=40", "data.val_size=4", "data.test_size=4", "train.max_tokens=120",
            "train.eval_every=1", "train.log_every=1"))
    assert sent and [p.name for p in (out / "checkpoints").glob("*")] == ["step-000000001"]
    assert load_file(out / "checkpoints" / "step-000000001" / "model.safetensors")
