"""Bad inputs and faults a user meets, rebuilt as repro cases and run through the CLI, one subprocess each.

Every case is data: the command line, what to damage first, and the outcome a user should get. The
script makes two tiny finished copy runs and copies of the fixture data (tests/data) in a temporary
folder, runs each case as ``python -m taskformer ...`` with a timeout, and classifies what happened:

    ok         exit 0 (expected success)
    error      exit 2 with an ``Error:`` line (an expected refusal)
    internal   an "internal error" line (exit 1): a bug the CLI caught
    traceback  a Python traceback
    hang       the timeout ran out
    crash      any other exit status
    skipped    a shell case that cannot run on this machine (exit 77)
    wrong      exit 0 where a refusal was expected, or a check on the result failed (lost output, a
               clobbered user file, a BOM learnt as a token, ...)
    misnamed   the refusal, but its line does not name what the case expects (the file, key or option)

    python bench/faults/faults.py [--json FILE] [--timeout 120] [--only NAME ...] [--keep DIR]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file, save_file

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
TINY = ["--quiet", "--set", "data.train_size=40", "--set", "data.val_size=4", "--set", "data.test_size=4",
        "--set", "train.max_steps=2"]  # tests/conftest.py: a run directory with every file, in seconds
TINY_TRANSLATE = [a for o in ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1",
                              "model.d_ff=64", "model.max_len=48", "train.max_steps=2", "train.max_tokens=600",
                              "train.bf16=false", "data.vocab_size=200", "decode.batch_size=8"]
                  for a in ("--set", o)]

Setup = Callable[[Path], object]  # prepares a case's folder; what it returns is ignored


@dataclass
class Case:
    """``argv`` is a list (or a shell line, run by bash) with ``{d}`` (this case's folder), ``{run}`` and
    ``{other}`` (two finished copy runs, never changed), ``{bad}`` (``{d}/run``: a copy of ``{run}`` that
    ``setup`` may damage), ``{data}`` (the fixture data) and ``{tf}`` (the CLI) filled in."""
    name: str
    expect: str  # "ok" or "error"
    argv: list[str] | str
    setup: Setup | None = None  # gets {d}; damages {bad} or writes inputs
    says: str | None = None  # an expected refusal names this
    check: Callable[[Path, str, str], str | None] | None = None  # (d, stdout, stderr) -> what went wrong
    stdin: bytes | None = None
    twice: bool = False  # start the command twice at once: ok only if one run writes and the other is refused


# -- damage ------------------------------------------------------------------------------------------------

def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    saved = json.loads(path.read_text())
    change(saved)
    path.write_text(json.dumps(saved))


def retype_weights(d: Path, change) -> None:
    tensors = load_file(d / "run" / "model.safetensors")
    first = sorted(tensors)[0]
    tensors[first] = change(tensors[first])
    save_file(tensors, d / "run" / "model.safetensors")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-15])


def unfinish(d: Path) -> None:
    (d / "run" / "result.json").unlink()


def swap_specials(d: Path) -> None:
    path = d / "run" / "tokenizer.json"
    text = path.read_text()
    path.write_text(text.replace('"[PAD]"', '"[TMP]"').replace('"[BOS]"', '"[PAD]"').replace('"[TMP]"', '"[BOS]"'))


def relink(d: Path, name: str, target: str) -> None:
    (d / "run" / name).unlink()
    (d / "run" / name).symlink_to(target)


def string_step(d: Path) -> None:
    unfinish(d)
    state = sorted((d / "run" / "checkpoints").glob("step-*"))[-1] / "state.json"
    edit_json(state, lambda s: s.update(step="5"))


def multi30k(d: Path, edit: Setup) -> None:
    shutil.copytree(DATA / "multi30k", d / "data")
    edit(d / "data")


def add_bom(data: Path) -> None:
    for path in data.iterdir():
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        raw = b"\xef\xbb\xbf" + raw
        path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)


def runs_root(d: Path, bad: Setup) -> None:
    """{d}/runs holds a good run and a broken one."""
    shutil.copytree(d.parent / "finished", d / "runs" / "good")
    (d / "runs" / "bad").mkdir()
    bad(d / "runs" / "bad" / "result.json")


# -- checks on an outcome ----------------------------------------------------------------------------------

def lines_out(n: int):
    return lambda d, out, err: None if len(out.splitlines()) == n else f"{len(out.splitlines())} output lines, not {n}"


def untouched(d: Path, out: str, err: str) -> str | None:
    return None if (d / "mine" / "report.txt").read_text() == "my notes\n" else "the user's report.txt was changed"


def two_run_dirs(d: Path, out: str, err: str) -> str | None:
    found = sorted(p.name for p in (d / "runs" / "copy").iterdir()) if (d / "runs" / "copy").is_dir() else []
    return None if len(found) == 2 else f"run directories: {found}"


def no_bom_token(d: Path, out: str, err: str) -> str | None:
    text = json.dumps(json.loads((d / "r" / "tokenizer.json").read_text()), ensure_ascii=False)
    return "the BOM is a token" if "\ufeff" in text else None


def lists_good(d: Path, out: str, err: str) -> str | None:
    return None if "good" in out and "bad" in err else "the good run is not listed or the bad one not named"


def result_unchanged(d: Path, out: str, err: str) -> str | None:
    same = (d / "run" / "result.json").read_bytes() == (d.parent / "finished" / "result.json").read_bytes()
    return None if same else "result.json was rewritten"


def someone_elses(d: Path) -> None:
    """A folder of another tool's files (a Hugging Face model) and a victim file outside the run."""
    (d / "hf").mkdir()
    for name, text in (("config.json", '{"model_type": "bert"}'), ("tokenizer.json", "{}"),
                       ("model.safetensors", "w"), ("notes.txt", "mine")):
        (d / "hf" / name).write_text(text)
    (d / "victim").write_text("mine")


def still_theirs(d: Path, out: str, err: str) -> str | None:
    kept = all((d / "hf" / n).exists() for n in ("config.json", "tokenizer.json", "model.safetensors", "notes.txt"))
    return None if kept and (d / "hf" / "notes.txt").read_text() == "mine" else "the folder's files were changed"


def victim_kept(d: Path, out: str, err: str) -> str | None:
    return None if (d / "victim").read_text() == "mine" else "a file was written through a link"


def hostile_outputs(d: Path) -> None:
    path = d / "run" / "outputs-test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "source": "\x1b]0;pwned\x07\x1b[2J [/]"}) + "\n" for r in rows))


def no_escapes(d: Path, out: str, err: str) -> str | None:
    shown = out + (d / "run" / "report.txt").read_text()
    return "an escape sequence reached the terminal or report.txt" if "\x1b" in shown else None


def leak(d: Path) -> None:
    (d / "victim").write_text("mine")
    (d / "secret").write_bytes(b"\x89PNG\r\n\x1a\n-----BEGIN OPENSSH PRIVATE KEY-----")
    (d / "run" / "leak.png").symlink_to(d / "secret")
    (d / "run" / "training.png").unlink(missing_ok=True)
    (d / "run" / "training.png").symlink_to(d / "victim")


def nothing_leaked(d: Path, out: str, err: str) -> str | None:
    if "BEGIN OPENSSH" in (d / "run" / "report.html").read_text() or b"LS0tLS1CRUdJTi" in (
            d / "run" / "report.html").read_bytes():
        return "the secret was embedded in report.html"
    return victim_kept(d, out, err)


def narrow_moment(d: Path) -> None:
    """A checkpoint whose first exp_avg has the wrong shape (fused AdamW wrote out of bounds)."""
    unfinish(d)
    path = sorted((d / "run" / "checkpoints").glob("step-*"))[-1] / "optimizer.safetensors"
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    key = next(k for k in tensors if k.endswith(".exp_avg"))
    tensors[key] = tensors[key][:1].clone()
    save_file(tensors, path, metadata=meta)


def absurd_epoch(d: Path) -> None:
    unfinish(d)
    edit_json(sorted((d / "run" / "checkpoints").glob("step-*"))[-1] / "state.json", lambda s: s.update(epoch=1000))


def export_notes(d: Path) -> None:
    (d / "hf").mkdir()
    (d / "hf" / "model.bin").write_text("someone's model")
    (d / "hf" / "notes.txt").write_text("mine")


def notes_kept(d: Path, out: str, err: str) -> str | None:
    ok = (d / "hf" / "notes.txt").read_text() == "mine" and (d / "hf" / "model.bin").read_text() == "someone's model"
    return None if ok else "export --overwrite changed a folder it did not write"


# -- the cases ---------------------------------------------------------------------------------------------

def copy_run(*args: str) -> list[str]:
    return ["run", "copy", "--out", "{d}/r", *TINY, *args]


def in_turn(*edits: Setup) -> Setup:
    """One setup that makes ``edits`` in turn."""
    def edit_all(d: Path) -> None:
        for edit in edits:
            edit(d)
    return edit_all


# Root ignores a file's mode unless it drops CAP_DAC_OVERRIDE, which setpriv does for the command it starts
READ_ONLY = ('chmod -R a-w {{bad}}; as=""; [ "$(id -u)" = 0 ] && as="setpriv --bounding-set=-dac_override,'
             '-dac_read_search"; $as {{tf}} {command} >/dev/null; code=$?; chmod -R u+w {{bad}}; exit $code')

CASES = [
    # Losing data
    Case("two runs, one --out", "error", copy_run(), twice=True, says="{d}/r"),
    Case("two runs, default names", "ok", ["run", "copy", *TINY], twice=True, check=two_run_dirs),
    Case("--out at a non-empty folder", "error", ["run", "copy", "--out", "{d}/mine", *TINY],
         setup=in_turn(lambda d: (d / "mine").mkdir(), lambda d: (d / "mine" / "report.txt").write_text("my notes\n")),
         says="mine", check=untouched),
    Case("undecodable stdin to predict", "ok", ["predict", "{run}"], stdin=b"1 2\n\xff\n3 4\n", check=lines_out(3)),
    Case("predict | head -1", "ok", "yes '1 2 3' | head -n 3000 | {tf} predict {run} | head -1", check=lines_out(1)),
    # Wrong results accepted silently
    Case("--set train.lr=inf", "error", copy_run("--set", "train.lr=inf"), says="train.lr"),
    Case("--set train.lr=1e30", "error", copy_run("--set", "train.lr=1e30")),
    Case("--time-limit nan", "error", copy_run("--time-limit", "nan"), says="--time-limit"),
    Case("--set train.clip=-5", "error", copy_run("--set", "train.clip=-5"), says="train.clip"),
    Case("--resume a finished run", "error", ["run", "--resume", "{bad}", "--quiet"], check=result_unchanged),
    Case("--resume with --seed", "error", ["run", "--resume", "{bad}", "--seed", "3"], setup=unfinish,
         says="--seed"),
    Case("--resume with TASK", "error", ["run", "copy", "--resume", "{bad}"], setup=unfinish),
    Case("--resume with --time-limit", "error", ["run", "--resume", "{bad}", "--time-limit", "5"], setup=unfinish,
         says="--time-limit"),
    Case("--resume with --out", "error", ["run", "--resume", "{bad}", "--out", "{d}/x"], setup=unfinish,
         says="--out"),
    Case("int64 weights", "error", ["predict", "{bad}", "1 2"], says="I64",
         setup=lambda d: retype_weights(d, lambda t: t.long())),
    Case("bool weights", "error", ["predict", "{bad}", "1 2"], says="BOOL",
         setup=lambda d: retype_weights(d, lambda t: t > 0)),
    Case("all-NaN weights", "error", ["predict", "{bad}", "1 2"], says="NaN",
         setup=lambda d: retype_weights(d, lambda t: t * float("nan"))),
    Case("swapped tokenizer specials", "error", ["predict", "{bad}", "1 2"], setup=swap_specials,
         says="tokenizer.json"),
    Case("config.json renamed to another task", "error", ["predict", "{bad}", "1 2"], says="translate-de-en",
         setup=lambda d: edit_json(d / "run" / "config.json",
                                   lambda c: c.update(task="translate-de-en", config={**c["config"], "data": {}}))),
    Case("weights symlinked to another run's", "error", ["predict", "{bad}", "1 2"], says="model.safetensors",
         setup=lambda d: relink(d, "model.safetensors", str(d.parent / "other" / "model.safetensors"))),
    Case("BOM in translate data", "ok",
         ["run", "translate-de-en", "--data-dir", "{d}/data", "--out", "{d}/r", "--quiet", *TINY_TRANSLATE],
         setup=lambda d: multi30k(d, add_bom), check=no_bom_token),
    Case("train.en and train.en.gz both present", "error",
         ["run", "translate-de-en", "--data-dir", "{d}/data", "--out", "{d}/r", "--quiet", *TINY_TRANSLATE],
         setup=lambda d: multi30k(d, lambda x: shutil.copy(x / "train.en", x / "train.en.gz")), says="train.en.gz"),
    # Hangs and resource blow-ups
    Case("data.vocab=100000000 on copy", "error", copy_run("--set", "data.vocab=100000000"), says="data.vocab"),
    Case("data.train_size=1e9 on copy", "error", copy_run("--set", "data.train_size=1000000000"),
         says="data.train_size"),
    Case("data.train_size=1e9 (float) on copy", "error", copy_run("--set", "data.train_size=1e9"),
         says="data.train_size"),
    Case("model.d_model=65536 on copy", "error", copy_run("--set", "model.d_model=65536"), says="model.d_model"),
    Case("config.json symlinked to /dev/zero", "error", ["predict", "{bad}", "1 2"], says="config.json",
         setup=lambda d: relink(d, "config.json", "/dev/zero")),
    Case("FIFO result.json for runs", "ok", ["runs", "{d}/runs"], check=lists_good,
         setup=lambda d: runs_root(d, os.mkfifo)),
    Case("disk full at the first checkpoint", "error",  # needs root (mount); skipped elsewhere
         "mkdir small && mount -t tmpfs -o size=400k tmpfs small || exit 77; "
         f"{{tf}} run copy --out small/r {' '.join(TINY)}; code=$?; umount small; exit $code", says="no space left"),
    # Errors that were one line but not clean
    Case("model.variant=encoder-only on copy", "error", copy_run("--set", "model.variant=encoder-only"),
         says="model.variant"),
    Case("--seed 1e23", "error", copy_run("--seed", "1e23"), says="--seed"),
    Case("--seed 10**23", "error", copy_run("--seed", "1" + "0" * 23), says="seed"),
    Case("model.max_len=1", "error", copy_run("--set", "model.max_len=1"), says="model.max_len"),
    Case("--out in /proc", "error", ["run", "copy", "--out", "/proc/taskformer-faults/r", *TINY],
         says="/proc/taskformer-faults"),
    Case("read-only --out", "error",  # a read-only mount, as root ignores a folder's mode; skipped elsewhere
         "mkdir ro && mount -t tmpfs -o ro,size=64k tmpfs ro || exit 77; "
         f"{{tf}} run copy --out ro/r {' '.join(TINY)}; code=$?; umount ro; exit $code", says="ro/r"),
    Case("--out is a file", "error", ["run", "copy", "--out", "{d}/afile", *TINY],
         setup=lambda d: (d / "afile").write_text("x"), says="afile"),
    Case("JSON array --config", "error", copy_run("--config", "{d}/list.json"),
         setup=lambda d: (d / "list.json").write_text("[1, 2]"), says="list.json"),
    Case("state.json with a string step", "error", ["run", "--resume", "{bad}", "--quiet"], setup=string_step,
         says="state.json"),
    Case("truncated outputs-test.jsonl: predict", "error", ["predict", "{bad}", "1 2"], says="outputs-test.jsonl",
         setup=lambda d: truncate(d / "run" / "outputs-test.jsonl")),
    Case("truncated outputs-test.jsonl: eval", "error", ["eval", "{bad}"], says="outputs-test.jsonl",
         setup=lambda d: truncate(d / "run" / "outputs-test.jsonl")),
    Case("truncated outputs-test.jsonl: report", "error", ["report", "{bad}"], says="outputs-test.jsonl",
         setup=lambda d: truncate(d / "run" / "outputs-test.jsonl")),
    Case("truncated metrics.jsonl: predict", "ok", ["predict", "{bad}", "1 2"],  # predict and eval do not read it
         setup=lambda d: truncate(d / "run" / "metrics.jsonl"), check=lines_out(1)),
    Case("truncated metrics.jsonl: eval", "ok", ["eval", "{bad}"],
         setup=lambda d: truncate(d / "run" / "metrics.jsonl")),
    Case("truncated metrics.jsonl: report", "error", ["report", "{bad}"], says="metrics.jsonl",
         setup=lambda d: truncate(d / "run" / "metrics.jsonl")),
    Case("truncated outputs-test.jsonl: resume", "ok", ["run", "--resume", "{bad}", "--quiet"],
         setup=in_turn(unfinish, lambda d: truncate(d / "run" / "outputs-test.jsonl"))),
    Case("truncated metrics.jsonl: resume", "ok", ["run", "--resume", "{bad}", "--quiet"],  # the killed write
         setup=in_turn(unfinish, lambda d: truncate(d / "run" / "metrics.jsonl"))),
    Case("one malformed result.json for runs", "ok", ["runs", "{d}/runs"], check=lists_good,
         setup=lambda d: runs_root(d, lambda p: p.write_text('{"task": "copy", "metric": "x", "info": "no"}'))),
    Case("predict --beam 500", "ok", ["predict", "{run}", "--beam", "500", "1 2 3"], check=lines_out(1)),
    Case("data.val_size=0", "error", copy_run("--set", "data.val_size=0"), says="data.val_size"),
    Case("model.d_model=1e20", "error", copy_run("--set", "model.d_model=1e20"), says="model.d_model"),
    Case("a directory given as a data file", "error",
         ["run", "translate-de-en", "--data-dir", "{d}/data", "--out", "{d}/r", "--quiet", *TINY_TRANSLATE],
         setup=lambda d: multi30k(d, in_turn(lambda x: (x / "val.de").unlink(), lambda x: (x / "val.de").mkdir())),
         says="not a regular file"),
    Case("new-task copy", "error", ["new-task", "copy", "--dir", "{d}/p"], says="already installed"),
    # Data loss, security, silent wrong results
    Case("--out at a Hugging Face model folder", "error", ["run", "copy", "--out", "{d}/hf", *TINY],
         setup=someone_elses, says="hf", check=still_theirs),
    Case("export --overwrite at a folder with a model.bin", "error",
         ["export", "{run}", "--to", "ctranslate2", "{d}/hf", "--overwrite"], setup=export_notes, check=notes_kept),
    Case("report with leak.png and training.png linked", "ok", ["report", "{bad}"], setup=leak, check=nothing_leaked),
    Case("escape sequences and [/] in outputs", "ok", ["report", "{bad}"], setup=hostile_outputs, check=no_escapes),
    Case("optimizer exp_avg of the wrong shape", "error", ["run", "--resume", "{bad}", "--quiet"],
         setup=narrow_moment, says="optimizer.safetensors"),
    Case("state.json with epoch 1000", "error", ["run", "--resume", "{bad}", "--quiet"], setup=absurd_epoch,
         says="state.json"),
    Case("decode.max_len_a=-1 for predict", "error", ["predict", "{run}", "--set", "decode.max_len_a=-1", "1 2"],
         says="decode.max_len_a"),
    Case("a folder named [/] for runs", "ok", ["runs", "{d}/runs"],
         setup=lambda d: shutil.copytree(d.parent / "finished", d / "runs" / "[/]"), check=lambda d, out, err: None
         if "[/]" in out else "the run in [/] is not listed"),
    Case("predict with stdout closed", "error", "echo 1 | {tf} predict {run} >&-", says="standard output"),
    Case("predict TEXT not UTF-8", "ok", "{tf} predict {run} $'1 \\xff 2'", check=lines_out(1)),
    # Added here
    Case("--config is a FIFO", "error", copy_run("--config", "{d}/fifo.toml"), says="fifo.toml",
         setup=lambda d: os.mkfifo(d / "fifo.toml")),
    Case("--config is /dev/zero", "error", copy_run("--config", "{d}/zero.toml"), says="zero.toml",
         setup=lambda d: (d / "zero.toml").symlink_to("/dev/zero")),
    Case("--time-limit 0", "error", copy_run("--time-limit", "0"), says="--time-limit"),
    Case("--set train.clip=nan", "error", copy_run("--set", "train.clip=nan"), says="train.clip"),
    Case("--set decode.beam=0", "error", copy_run("--set", "decode.beam=0"), says="decode.beam"),
    Case("predict on a folder that is no run", "error", ["predict", "{d}", "1 2"], says="config.json"),
    Case("eval --split test with no data", "error",
         ["eval", "{d}/r", "--split", "test", "--data-dir", "{d}/empty"],
         setup=in_turn(lambda d: shutil.copytree(d.parent / "translate", d / "r"), lambda d: (d / "empty").mkdir()),
         says="empty"),
    Case("predict of a translate run", "ok", ["predict", "{d}/r", "Ein Hund."],
         setup=lambda d: shutil.copytree(d.parent / "translate", d / "r"), check=lines_out(1)),
    Case("truncated model.safetensors", "error", ["predict", "{bad}", "1 2"], says="model.safetensors",
         setup=lambda d: truncate(d / "run" / "model.safetensors")),
    Case("pickle file in a run", "error", ["predict", "{bad}", "1 2"], says="model.pt",
         setup=lambda d: (d / "run" / "model.pt").write_bytes(b"\x80\x04K\x01.")),
    Case("eval --set train.lr=1", "error", ["eval", "{run}", "--set", "train.lr=1"], says="train.lr"),
    Case("eval --set decode.beam=x", "error", ["eval", "{run}", "--set", "decode.beam=x"], says="decode.beam"),
    Case("eval --average 5 with none kept", "error", ["eval", "{run}", "--average", "5"], says="average"),
    Case("report of a folder that is no run", "error", ["report", "{d}"], says="config.json"),
    Case("runs of a missing folder", "error", ["runs", "{d}/nothing"], says="nothing"),
    Case("resume of an empty folder", "error", ["run", "--resume", "{d}"], says="config.json"),
    Case("export of a run to its own folder", "error", ["export", "{bad}", "--to", "ctranslate2", "{bad}"]),
    Case("empty stdin to predict", "ok", ["predict", "{run}"], stdin=b"", check=lines_out(0)),
    Case("blank and CRLF lines to predict", "ok", ["predict", "{run}"], stdin=b"\r\n\n1 2\r\n", check=lines_out(3)),
    # Report errors that blamed the built-in plugin, what the fuzz tests found, read-only
    Case("result.json metrics as text: report", "error", ["report", "{bad}"], says="result.json: metrics",
         setup=lambda d: edit_json(d / "run" / "result.json", lambda r: r.update(metrics="x"))),
    Case("result.json notes a number: report", "error", ["report", "{bad}"], says="result.json: info.notes",
         setup=lambda d: edit_json(d / "run" / "result.json", lambda r: r["info"].update(notes=1))),
    Case("metrics.jsonl event without loss: report", "error", ["report", "{bad}"], says="metrics.jsonl: 'loss'",
         setup=lambda d: (d / "run" / "metrics.jsonl").open("a").write('{"event": "train", "step": 1, "lr": 1}\n')),
    Case("state.json a JSON list: resume", "error", ["run", "--resume", "{bad}", "--quiet"], says="state.json",
         setup=in_turn(unfinish, lambda d: [s.write_text("[]") for s in (d / "run" / "checkpoints").glob("*/state.json")])),
    Case("config.json data_dir a number: eval", "error", ["eval", "{bad}"], says="config.json",
         setup=lambda d: edit_json(d / "run" / "config.json", lambda c: c.update(data_dir=1))),
    Case("read-only run directory: report", "error", READ_ONLY.format(command="report {bad}"),
         says="taskformer report"),
    Case("read-only run directory: resume", "error", READ_ONLY.format(command="run --resume {bad} --quiet"),
         setup=unfinish, says="taskformer run --resume"),
]


# -- running -----------------------------------------------------------------------------------------------

def classify(code: int | None, out: str, err: str) -> str:
    if code is None:
        return "hang"
    if "Traceback (most recent call last)" in out + err:
        return "traceback"
    if "internal error" in err:
        return "internal"
    if code == 0:
        return "ok"
    if code == 77:
        return "skipped"
    if code == 2 and any(line.startswith("Error:") for line in err.splitlines()):
        return "error"
    return "crash"


def run_case(case: Case, work: Path, timeout: float) -> dict:
    d = work / case.name.replace(" ", "_").replace("/", "_")
    d.mkdir()
    if "{bad}" in str(case.argv):
        shutil.copytree(work / "finished", d / "run")
    if case.setup:
        case.setup(d)
    fill = {"d": d, "run": work / "finished", "other": work / "other", "bad": d / "run", "data": DATA,
            "tf": f"{sys.executable} -m taskformer"}
    shell = isinstance(case.argv, str)
    command = ["bash", "-c", case.argv.format(**fill)] if isinstance(case.argv, str) else \
        [sys.executable, "-m", "taskformer", *(a.format(**fill) for a in case.argv)]
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.monotonic()
    procs = [subprocess.Popen(command, cwd=d, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True) for _ in range(2 if case.twice else 1)]
    results = []
    for proc in procs:
        try:
            raw_out, raw_err = proc.communicate(case.stdin, timeout=max(1.0, timeout - (time.monotonic() - start)))
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the shell's pipeline too
            raw_out, raw_err = proc.communicate()
            code = None
        out, err = raw_out.decode(errors="replace"), raw_err.decode(errors="replace")
        results.append((classify(code, out, err), code, out, err))
    seconds = time.monotonic() - start
    outcomes = sorted(r[0] for r in results)
    if case.twice and case.expect == "error":  # one writer wins, the other is refused
        outcome = "error" if outcomes == ["error", "ok"] else \
            next((o for o in outcomes if o not in ("ok", "error")), "wrong")  # both wrote, or both were refused
    else:
        outcome = next((o for o in outcomes if o != case.expect), case.expect)
    _, code, out, err = next((r for r in results if r[0] == outcome), results[-1])
    note = ""
    if outcome == "ok" and case.expect == "error":
        outcome, note = "wrong", "accepted"
    elif outcome == case.expect == "error" and case.says and case.says.format(**fill) not in err:
        outcome, note = "misnamed", f"does not name {case.says.format(**fill)!r}"
    elif outcome == case.expect and case.check and (problem := case.check(d, out, err)):
        outcome, note = "wrong", problem
    lines = err.strip().splitlines()
    message = next((line for line in lines if line.startswith("Error:")), " | ".join(lines[-3:]))
    return {"case": case.name, "expect": case.expect, "outcome": outcome, "as_expected": outcome == case.expect,
            "exit": [r[1] for r in results], "seconds": round(seconds, 1), "message": message, "note": note,
            "command": command[2] if shell else " ".join(command[2:])}


def finish_run(out: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "taskformer", "run", *args, "--out", str(out)], capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit(f"the base run failed: {done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every case's outcome here")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per case (default 120)")
    parser.add_argument("--only", nargs="+", action="extend", default=[],
                        help="run only cases whose name contains one of these")
    parser.add_argument("--keep", type=Path, help="work in this new folder and keep it (default: a temp folder)")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or any(s in c.name for s in args.only)]
    work = args.keep or Path(tempfile.mkdtemp(prefix="taskformer-faults-"))
    work.mkdir(parents=True, exist_ok=bool(not args.keep))
    try:
        finish_run(work / "finished", "copy", *TINY)
        finish_run(work / "other", "copy", "--seed", "7", *TINY)
        finish_run(work / "translate", "translate-de-en", "--data-dir", str(DATA / "multi30k"), "--quiet",
                   *TINY_TRANSLATE)
        rows = []
        for case in cases:
            rows.append(run_case(case, work, args.timeout))
            row = rows[-1]
            mark = " " if row["as_expected"] else "!"
            print(f"{mark} {row['case'][:40]:40} {row['expect']:5} {row['outcome']:9} {row['seconds']:6.1f}s  "
                  f"{(row['note'] + ': ' if row['note'] else '') + row['message']}"[:200], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in
              ("ok", "error", "internal", "traceback", "hang", "crash", "wrong", "misnamed", "skipped")}
    print(f"\ncases {len(rows)}, as expected {sum(r['as_expected'] for r in rows)}: "
          + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if args.json:
        args.json.write_text(json.dumps({"counts": {"cases": len(rows), **counts}, "cases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
