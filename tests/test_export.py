"""`taskformer export --to ctranslate2`: CTranslate2 decodes exactly as taskformer does, and bad cases are refused."""
import importlib.util
import json
import random
import re
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tokenizers import Tokenizer

from taskformer.app.cli import main

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

needs_ct2 = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None,
                               reason="ctranslate2 is not installed (pip install taskformer[export])")
DATA = Path(__file__).parent / "data"
BUDGET = 30  # decode.max_len_b with max_len_a=0: every sentence gets the same budget, one CTranslate2 call


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env={"COLUMNS": "200"})


def train_copy(out: Path, *overrides: str) -> Path:
    """The default copy run (100% exact match) with a fixed decoding budget, in fp32: `predict` decodes
    in the run's precision, and the equality under test is fp32 against fp32."""
    settings = ["train.bf16=false", "decode.max_len_a=0", f"decode.max_len_b={BUDGET}", "data.val_size=50",
                "data.test_size=50", *overrides]
    result = invoke("run", "copy", "--out", str(out), "--quiet", *[a for o in settings for a in ("--set", o)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    return train_copy(tmp_path_factory.mktemp("export") / "copy")


def held_out(seed: int, n: int, lengths: tuple[int, int]) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(str(rng.randint(1, 10)) for _ in range(rng.randint(*lengths))) for _ in range(n)]


def ct2_greedy(model_dir: Path, texts: list[str], compute_type: str) -> list[str]:
    """Greedy outputs of an exported model, tokenized and detokenized with the tokenizer.json beside it."""
    import ctranslate2

    info = json.loads((model_dir / "taskformer.json").read_text())
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    threads = torch.get_num_threads()
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type, intra_threads=1)
    torch.set_num_threads(threads)  # the Translator sets the OpenMP threads it shares with torch to 1
    results = translator.translate_batch([tok.encode(t).tokens for t in texts], beam_size=1,
                                         max_decoding_length=info["decode"]["max_len_b"],
                                         max_input_length=info["max_input_length"],
                                         disable_unk=True, suppress_sequences=[["[PAD]"], ["[BOS]"]])
    vocab = tok.get_vocab()
    return [tok.decode([vocab[t] for t in r.hypotheses[0]]) for r in results]


def assert_same_greedy(cli, run: Path, out: Path) -> None:
    # Lengths 1..20 while the model was trained on 10: many outputs are wrong copies, some run to the
    # budget, and the batch is padded on both sides, so equal outputs mean equal numerics. (Where this
    # was written, the smallest top-2 logit gap over these inputs was 3e-3: far above fp32 rounding.)
    texts = held_out(1234, 100, (1, 20))
    result = cli("export", str(run), "--to", "ctranslate2", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "taskformer.json"):
        assert (out / name).is_file(), name
    ours = cli("predict", str(run), "--beam", "1", input="\n".join(texts) + "\n")
    assert ours.exit_code == 0
    ours = ours.stdout.splitlines()
    assert len(ours) == len(texts)
    assert sum(o != t for o, t in zip(ours, texts)) >= 10  # the comparison is not only of perfect copies
    assert ct2_greedy(out, texts, "float32") == ours


@needs_ct2
def test_ctranslate2_greedy_equals_taskformer_greedy_on_every_held_out_sentence(copy_run, cli, tmp_path):
    assert_same_greedy(cli, copy_run, tmp_path / "ct2")


@needs_ct2
def test_post_norm_and_untied_embeddings_export_as_exactly(cli, tmp_path):
    run = train_copy(tmp_path / "run", "model.norm_first=false", "model.tie_embeddings=false")
    assert_same_greedy(cli, run, tmp_path / "ct2")


@needs_ct2
def test_int8_export_is_smaller_and_still_copies(copy_run, cli, tmp_path):
    for quantization in ("float32", "int8"):
        result = cli("export", str(copy_run), "--to", "ctranslate2", str(tmp_path / quantization),
                     "--quantization", quantization)
        assert result.exit_code == 0, result.output
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.4 * (tmp_path / "float32" / "model.bin").stat().st_size
    # The trained length, where the fp32 model copies every sentence; int8 rounding may flip a few
    # near-even choices (1 in 100 in a run under forced AVX2), not the task.
    texts = held_out(99, 100, (10, 10))
    assert ct2_greedy(tmp_path / "float32", texts, "float32") == texts
    assert sum(o == t for o, t in zip(ct2_greedy(tmp_path / "int8", texts, "int8"), texts)) >= 90


@needs_ct2
def test_output_folder_is_never_clobbered_by_accident(copy_run, cli, tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    result = cli("export", str(copy_run), "--to", "ctranslate2", str(other), "--overwrite")
    assert result.exit_code == 2 and "exists and is not empty" in result.stderr
    assert (other / "keep.txt").read_text() == "mine"

    out = tmp_path / "ct2"
    assert cli("export", str(copy_run), "--to", "ctranslate2", str(out)).exit_code == 0
    again = cli("export", str(copy_run), "--to", "ctranslate2", str(out), "--quantization", "int8")
    assert again.exit_code == 2 and "--overwrite" in again.stderr
    assert json.loads((out / "taskformer.json").read_text())["quantization"] == "float32"
    assert cli("export", str(copy_run), "--to", "ctranslate2", str(out), "--quantization", "int8",
               "--overwrite").exit_code == 0
    assert json.loads((out / "taskformer.json").read_text())["quantization"] == "int8"


@needs_ct2
def test_the_python_example_in_docs_export_md_runs(copy_run, cli, tmp_path, monkeypatch, capsys):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text(encoding="utf-8")
    example = next(block for block in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "copy-ct2" in block)
    monkeypatch.chdir(tmp_path)
    assert cli("export", str(copy_run), "--to", "ctranslate2", "copy-ct2").exit_code == 0
    threads = torch.get_num_threads()
    try:
        exec(example, {})
    finally:
        torch.set_num_threads(threads)  # the example's Translator changed them
    assert capsys.readouterr().out == "['1 4 7 2 9 3 5 8 2 6']\n"


def test_missing_ctranslate2_says_how_to_install_it(copy_run, cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` now raises ImportError
    result = cli("export", str(copy_run), "--to", "ctranslate2", str(tmp_path / "ct2"))
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: exporting to CTranslate2 needs the ctranslate2 package: "
                                     "pip install taskformer[export]")
    assert not (tmp_path / "ct2").exists()


def test_encoder_only_runs_are_refused_with_the_reason(cli, tmp_path):
    run = tmp_path / "agnews"
    result = cli("run", "agnews", "--data-dir", str(DATA / "ag_news"), "--out", str(run), "--quiet",
                 "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.enc_layers=1",
                 "--set", "model.d_ff=64", "--set", "train.max_steps=1", "--set", "data.vocab_size=300")
    assert result.exit_code == 0, result.output
    result = cli("export", str(run), "--to", "ctranslate2", str(tmp_path / "ct2"))
    assert result.exit_code == 2
    assert "only encoder-decoder and decoder-only models" in result.stderr and "classification head" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ct2").exists()


@needs_ct2
def test_constrained_couplet_decoder_is_refused_unless_forced(cli, tmp_path):
    run = tmp_path / "couplet"
    tiny = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1", "model.d_ff=64",
            "model.max_len=40", "train.max_steps=1", "train.bf16=false", "data.val_size=6"]
    result = cli("run", "couplet", "--data-dir", str(DATA / "couplets"), "--out", str(run), "--quiet",
                 *[a for o in tiny for a in ("--set", o)])
    assert result.exit_code == 0, result.output
    refused = cli("export", str(run), "--to", "ctranslate2", str(tmp_path / "ct2"))
    assert refused.exit_code == 2
    assert "its plugin's own search" in refused.stderr and "--force" in refused.stderr
    assert not (tmp_path / "ct2").exists()
    forced = cli("export", str(run), "--to", "ctranslate2", str(tmp_path / "ct2"), "--force")
    assert forced.exit_code == 0
    assert forced.stderr.startswith("warning: task 'couplet' is decoded by its plugin's own search")
    assert (tmp_path / "ct2" / "model.bin").is_file()


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))}


@needs_ct2
def test_overwrite_replaces_only_the_files_an_earlier_export_listed(finished, cli, tmp_path):
    # A folder that merely holds a model.bin is not an export of ours: refused, nothing changed.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "model.bin").write_text("someone's model")
    (theirs / "notes.txt").write_text("my notes")
    before = tree(theirs)
    result = cli("export", str(finished), "--to", "ctranslate2", str(theirs), "--overwrite")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "nothing in it was changed" in result.stderr and tree(theirs) == before

    out = tmp_path / "ct2"
    assert cli("export", str(finished), "--to", "ctranslate2", str(out)).exit_code == 0
    listed = json.loads((out / "taskformer.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in out.iterdir())
    (out / "notes.txt").write_text("my notes")  # the user's, beside the export
    victim = tmp_path / "victim.json"
    victim.write_text("not a tokenizer")
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").symlink_to(victim)  # a link is replaced, never written through
    again = cli("export", str(finished), "--to", "ctranslate2", str(out), "--quantization", "int8", "--overwrite")
    assert again.exit_code == 0, again.output
    assert json.loads((out / "taskformer.json").read_text())["quantization"] == "int8"
    assert (out / "notes.txt").read_text() == "my notes" and victim.read_text() == "not a tokenizer"
    assert not (out / "tokenizer.json").is_symlink()
    assert not [p for p in tmp_path.iterdir() if ".export-" in p.name]  # no staging folder left
