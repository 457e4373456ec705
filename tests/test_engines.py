"""``decode.engine``: CTranslate2 decodes what our decoder decodes, chosen by ``auto`` where it can, for
predict, eval, the Python API and serve; its converted model lives in the user's cache."""
from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

import taskformer
from taskformer import hookimpl, search
from taskformer.app import engines
from taskformer.core.decode_config import DecodeConfig
from taskformer.testing import run_task

needs_ct2 = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None,
                               reason="ctranslate2 is not installed (pip install taskformer[export])")
CPU = {"ctranslate2": frozenset({"float32", "int8", "int8_float32", "int16"}),
       "onnxruntime": frozenset({"float32", "int8"})}
COPY = engines.Facts("encoder-decoder", 1, None, None, "cpu")


def held_out(seed: int, n: int, lengths: tuple[int, int]) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(str(rng.randint(1, 10)) for _ in range(rng.randint(*lengths))) for _ in range(n)]


# -- auto's choice: a pure function of the run, the options and what is installed ----------------------------

def test_auto_picks_the_runtime_that_can_decode_each_variant():
    for variant, runtime in [("encoder-decoder", "ctranslate2"), ("decoder-only", "ctranslate2"),
                             ("encoder-only", "onnxruntime"), ("tagging", "onnxruntime")]:
        choice = engines.choose("auto", COPY._replace(variant=variant), DecodeConfig(), False, CPU)
        assert (choice.engine, choice.compute_type) == (runtime, "float32"), variant
        assert choice.reason.startswith(f"auto: {runtime} is installed")


@pytest.mark.parametrize("facts, decode, found, why", [
    (COPY._replace(members=3), DecodeConfig(), CPU, "ensemble of 3 networks (model.members)"),
    (COPY._replace(own_decoder="couplet"), DecodeConfig(), CPU, "plugin 'couplet''s own search"),
    (COPY._replace(own_head="MyHead"), DecodeConfig(), CPU, "its own output head (MyHead)"),
    (COPY, DecodeConfig(compile=True), CPU, "decode.compile=true"),
    (COPY, DecodeConfig(), {}, "ctranslate2 is not installed (pip install taskformer[export])"),
    (COPY._replace(device="cuda"), DecodeConfig(), {}, "ctranslate2 with CUDA is not installed"),
    (COPY, DecodeConfig(temperature=0.8), CPU, "sampling: decode.seed"),
    (COPY._replace(variant="encoder-only", members=2), DecodeConfig(), CPU, "ONNX Runtime runs one network"),
    (COPY._replace(variant="tagging"), DecodeConfig(), {"ctranslate2": CPU["ctranslate2"]}, "onnxruntime is not"),
    (COPY._replace(variant="decoder-only", positions=64), DecodeConfig(max_new_tokens=64), CPU,
     "decode.max_new_tokens=64 leaves no room for a prompt in the model's 64 positions"),
], ids=["ensemble", "decode-hook", "own-head", "compile", "not-installed", "no-cuda", "sampling", "onnx-ensemble",
        "onnx-not-installed", "no-room-for-a-prompt"])
def test_auto_falls_back_to_torch_and_says_why(facts, decode, found, why):
    choice = engines.choose("auto", facts, decode, False, found)
    assert choice.engine == "torch" and why in choice.reason


@needs_ct2
def test_a_gpu_whose_cuda_libraries_ctranslate2_cannot_load_is_not_offered_to_it(monkeypatch):
    """A GPU CTranslate2 sees but whose cuBLAS it cannot open (torch built for another CUDA): auto must
    not choose it and fail at the first sentence."""
    import ctranslate2

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    monkeypatch.setattr(engines.ctypes, "CDLL", missing)
    found = engines.available("cuda")
    assert "ctranslate2" not in found
    choice = engines.choose("auto", COPY._replace(device="cuda"), DecodeConfig(), False, found)
    assert choice.engine == "torch" and "needs libcublas.so.12" in choice.reason


def test_an_engine_asked_for_by_name_is_refused_where_it_cannot_decode_never_swapped():
    with pytest.raises(engines.EngineError, match=r"decode.engine=ctranslate2: the run is an ensemble of 2"):
        engines.choose("ctranslate2", COPY._replace(members=2), DecodeConfig(), False, CPU)
    with pytest.raises(engines.EngineError, match="decode.engine=onnxruntime: it decodes classifiers and taggers, "
                                                  "and this run is encoder-decoder"):
        engines.choose("onnxruntime", COPY, DecodeConfig(), False, CPU)
    # by name, sampling goes to CTranslate2 (its seed's guarantee is weaker: docs/engines.md)
    assert engines.choose("ctranslate2", COPY, DecodeConfig(temperature=1.0), False, CPU).engine == "ctranslate2"
    assert engines.choose("torch", COPY._replace(members=5), DecodeConfig(), False, {}).engine == "torch"


def test_compute_types_follow_decode_quantize_and_the_runs_precision():
    int8 = engines.choose("auto", COPY, DecodeConfig(quantize="int8"), False, CPU)
    assert int8.compute_type == "int8"
    bf16 = engines.choose("auto", COPY, DecodeConfig(), True, CPU | {"ctranslate2": CPU["ctranslate2"] | {"bfloat16"}})
    assert bf16.compute_type == "bfloat16"
    no_bf16 = engines.choose("auto", COPY, DecodeConfig(), True, CPU)
    assert no_bf16.compute_type == "float32" and "no bf16 here" in no_bf16.reason
    onnx = engines.choose("auto", COPY._replace(variant="encoder-only"), DecodeConfig(quantize="int8"), True, CPU)
    assert onnx.compute_type == "int8"
    # ONNX Runtime runs the exported fp32 network, and says so where our decoder would use bf16
    onnx = engines.choose("auto", COPY._replace(variant="encoder-only"), DecodeConfig(), True, CPU)
    assert onnx.compute_type == "float32" and "where our decoder would use bf16" in onnx.reason
    onnx = engines.choose("auto", COPY._replace(variant="encoder-only"), DecodeConfig(), False, CPU)
    assert onnx.compute_type == "float32" and "bf16" not in onnx.reason


# -- a tiny trained run through each command --------------------------------------------------------------

@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """A copy run trained enough that its outputs are not ties (fp32: the equality is fp32 against fp32)."""
    out = tmp_path_factory.mktemp("engines") / "copy"
    run_task("copy", out, steps=60, settings={"train.bf16": False, "data.train_size": 400, "data.val_size": 20,
                                              "data.test_size": 20, "decode.max_len_a": 1.0, "decode.max_len_b": 4})
    return out


def predicted(cli, run: Path, texts: list[str], *args: str) -> tuple[list, dict]:
    """``predict --json`` outputs and the engine it says ran."""
    result = cli("predict", str(run), "--json", *args, input="\n".join(texts) + "\n")
    assert result.exit_code == 0, result.stderr
    engine = json.loads(result.stderr.split("engine: ", 1)[1].splitlines()[0])
    return [json.loads(line) for line in result.stdout.splitlines()], engine


@needs_ct2
def test_ctranslate2_greedy_equals_ours_on_every_held_out_input(cli, copy_run):
    texts = held_out(7, 150, (1, 16))  # longer than trained on: wrong copies and outputs cut by the budget too
    ours, torch_engine = predicted(cli, copy_run, texts, "--beam", "1", "--set", "decode.engine=torch")
    theirs, engine = predicted(cli, copy_run, texts, "--beam", "1")
    assert torch_engine == {"engine": "torch", "compute_type": "", "reason": "decode.engine=torch"}
    assert engine["engine"] == "ctranslate2" and engine["reason"].startswith("auto: ")
    assert sum(o != t for o, t in zip(ours, texts)) >= 10  # not only perfect copies
    assert theirs == ours


@needs_ct2
def test_beam_length_penalty_sampling_and_int8_run_in_ctranslate2(cli, copy_run):
    texts = held_out(8, 20, (1, 10))
    for args in [("--beam", "5"), ("--beam", "4", "--set", "decode.length_penalty=0"),
                 ("--set", "decode.quantize=int8", "--beam", "1"), ("--set", "decode.max_len_a=0.5", "--set", "decode.max_len_b=0", "--beam", "1")]:  # noqa: E501
        outputs, engine = predicted(cli, copy_run, texts, "--set", "decode.engine=ctranslate2", *args)
        assert engine["engine"] == "ctranslate2" and len(outputs) == len(texts), args
        assert engine["compute_type"] == ("int8" if "decode.quantize=int8" in args else "float32")
        if "decode.max_len_a=0.5" in args:  # a budget that cuts most copies short: cut where ours cuts them
            assert sum(len(o.split()) < len(t.split()) for o, t in zip(outputs, texts)) >= 10
            assert outputs == predicted(cli, copy_run, texts, "--set", "decode.engine=torch", *args)[0]
    sampled = ("--set", "decode.engine=ctranslate2", "--set", "decode.temperature=1.0", "--set", "decode.seed=4")
    first, _ = predicted(cli, copy_run, texts, *sampled)
    again, _ = predicted(cli, copy_run, texts, *sampled)
    assert first == again  # a new process, the same inputs in the same order and seed: the same draws


@needs_ct2
def test_eval_and_the_report_say_which_engine_ran(cli, copy_run):
    for asked, engine in [("auto", "ctranslate2"), ("torch", "torch")]:
        result = cli("eval", str(copy_run), "--split", "val", "--json", "--set", f"decode.engine={asked}",
                     "--set", "decode.strategy=greedy")
        assert result.exit_code == 0, result.stderr
        evaluated = json.loads(result.stdout)
        assert evaluated["engine"]["engine"] == engine
        scores = evaluated["metrics"]["val"]
        if asked == "auto":
            auto_scores = scores
    assert auto_scores == scores  # greedy outputs equal: equal metrics
    saved = json.loads((copy_run / "result.json").read_text())
    assert saved["info"]["engine"].startswith("ctranslate2 float32 (auto: ")
    assert "decode engine" in (copy_run / "report.txt").read_text()


@needs_ct2
def test_the_python_api_picks_and_names_the_engine(copy_run):
    model = taskformer.load(copy_run)
    assert model.engine()["engine"] == "ctranslate2"
    assert model.engine(engine="torch") == {"engine": "torch", "compute_type": "", "reason": "decode.engine=torch"}
    texts = held_out(9, 30, (1, 12))
    assert model.predict(texts, beam=1) == model.predict(texts, beam=1, engine="torch")
    with pytest.raises(taskformer.TaskformerError, match="decode.engine=onnxruntime: it decodes classifiers"):
        model.predict(texts, engine="onnxruntime")


@needs_ct2
def test_an_int8_conversion_leaves_the_models_weights_as_they_were(copy_run, tmp_path, monkeypatch):
    """CTranslate2's quantizer scales the arrays it converts in place: they must be copies, or converting
    a served or loaded model to int8 would rescale its own weights (every later decode wrong)."""
    monkeypatch.setenv("TASKFORMER_CACHE", str(tmp_path / "cache"))  # converted now, not found in a cache
    model = taskformer.load(copy_run)
    texts = held_out(13, 30, (1, 12))
    before = model.predict(texts, beam=1, engine="torch")
    model.predict(texts, beam=1, engine="ctranslate2", quantize="int8")
    assert model.predict(texts, beam=1, engine="torch") == before
    assert model.predict(texts, beam=1, engine="ctranslate2") == before  # fp32, converted after it: the same weights


@needs_ct2
def test_a_remembered_engine_follows_a_change_of_decode_engine_of_the_weights_and_of_what_is_installed(
        copy_run, monkeypatch):
    """The engine's choice and its loaded runtime are kept between predict calls, never past a change
    of what they were made of."""
    import torch

    from taskformer.app import hooks, runner

    run = runner.load(copy_run)
    auto, ours = (runner.with_search(runner.with_decoding(run, {"engine": e}, "test"), 1) for e in ("auto", "torch"))
    texts = held_out(10, 30, (1, 12))
    before = runner.predict(run, texts, auto)[0]
    assert hooks.engine_choice(run.task, run.model, auto).engine == "ctranslate2"
    assert hooks.engine_choice(run.task, run.model, ours).engine == "torch"  # the same model, another config
    calls = []
    monkeypatch.setattr(engines, "decode", lambda *a: calls.append(1) or pytest.fail("a runtime decoded"))
    assert runner.predict(run, texts, ours)[0] == before  # decoded by torch: no runtime call
    monkeypatch.undo()
    with torch.no_grad():  # new weights, changed in place (as an update or load_state_dict changes them)
        generator = torch.Generator().manual_seed(0)
        for p in run.model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * p.std().nan_to_num(0.1))
    expected = runner.predict(run, texts, ours)[0]
    after = runner.predict(run, texts, auto)[0]
    assert after != before and after == expected  # the new weights, in CTranslate2 too
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # uninstalled, as far as this process can tell
    assert hooks.engine_choice(run.task, run.model, auto).reason.startswith("auto: ctranslate2 is not installed")


@needs_ct2
def test_ctranslate2_decodes_sources_of_several_lengths_in_one_batch(copy_run, monkeypatch):
    """A server's batch mixes lengths: CTranslate2 takes it whole (each row cut to its own budget), where
    our decoder splits it by length into batches of a sentence or two."""
    from taskformer.core.runtimes import CTranslate2Search

    calls: list[int] = []
    run = CTranslate2Search._run
    monkeypatch.setattr(CTranslate2Search, "_run", lambda self, rows, *a: calls.append(len(rows)) or run(self, rows, *a))
    model = taskformer.load(copy_run)
    texts = held_out(11, 40, (1, 14))  # 14 lengths
    settings = {"beam": 1, "batch_size": 16, "max_len_a": 0.5, "max_len_b": 1}  # budgets that cut most rows
    assert model.predict(texts, **settings) == model.predict(texts, engine="torch", **settings)
    assert calls == [16, 16, 8]


@needs_ct2
@pytest.mark.parametrize("penalty", [1.0, 0.0])
def test_a_ctranslate2_beam_gives_each_row_what_it_gives_alone(copy_run, monkeypatch, penalty):
    """A beam's hypotheses depend on where the budget ends them: a batch of several budgets decodes in one
    call, then again only the rows that reached their own budget's last step (without a length penalty,
    one call per budget), and every row's output is the one it gets alone."""
    from taskformer.core.runtimes import CTranslate2Search

    calls: list[int] = []
    run = CTranslate2Search._run
    monkeypatch.setattr(CTranslate2Search, "_run", lambda self, rows, *a: calls.append(len(rows)) or run(self, rows, *a))
    model = taskformer.load(copy_run)
    texts = held_out(12, 24, (1, 14))  # 14 lengths, some longer than trained on: some outputs run to the budget
    settings = {"beam": 4, "batch_size": 32, "max_len_a": 1.0, "max_len_b": 1, "length_penalty": penalty}
    together = model.predict(texts, **settings)
    in_batch, calls[:] = list(calls), []
    assert together == [model.predict([text], **settings)[0] for text in texts]
    assert len(calls) == len(texts)  # alone: one call each
    if penalty:
        assert in_batch[0] == len(texts) and sum(in_batch[1:]) < len(texts)  # the longest budget's rows: exact at once
    else:
        assert sum(in_batch) == len(texts) and len(in_batch) > 1


@needs_ct2
def test_fallbacks_through_the_command_line(cli, copy_run, register):
    class OwnSearch:  # a plugin with a decode hook of its own, as couplet's constrained search is
        @hookimpl
        def taskformer_decode(self, model, src, tokenizer, config):
            return [tokenizer.decode(ids) for ids in search(model, src, config.decode)]

    register(OwnSearch(), "own-search")
    outputs, engine = predicted(cli, copy_run, ["1 2 3"])
    assert engine["engine"] == "torch" and "plugin 'own-search''s own search" in engine["reason"]
    refused = cli("predict", str(copy_run), "1 2 3", "--set", "decode.engine=ctranslate2")
    assert refused.exit_code == 2 and refused.stderr.startswith("Error: decode.engine=ctranslate2: task decoded by")
    assert refused.stdout == ""


@needs_ct2
def test_without_ctranslate2_auto_decodes_with_torch_and_a_named_engine_is_refused(cli, copy_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` now raises ImportError
    outputs, engine = predicted(cli, copy_run, ["1 2 3"])
    assert engine["engine"] == "torch" and "ctranslate2 is not installed (pip install taskformer[export])" in \
        engine["reason"]
    refused = cli("predict", str(copy_run), "1 2 3", "--set", "decode.engine=ctranslate2")
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines() == [
        "Error: decode.engine=ctranslate2: ctranslate2 is not installed (pip install taskformer[export])"]


def test_an_ensemble_decodes_with_torch(cli, tmp_path):
    out = tmp_path / "ensemble"
    run_task("copy", out, steps=2, settings={"model.members": 2, "data.train_size": 40, "data.val_size": 4,
                                             "data.test_size": 4})
    _, engine = predicted(cli, out, ["1 2 3"])
    assert engine["engine"] == "torch" and "ensemble of 2 networks" in engine["reason"]


# -- the cache ------------------------------------------------------------------------------------------------

@needs_ct2
def test_the_model_is_converted_once_into_the_users_cache_and_reused(cli, copy_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKFORMER_CACHE", str(tmp_path / "cache"))
    before = sorted(p.name for p in copy_run.iterdir())
    first, _ = predicted(cli, copy_run, ["1 2 3"])
    entries = [p for p in (tmp_path / "cache" / "engines").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and (entries[0] / "model.bin").is_file()
    written = (entries[0] / "model.bin").stat().st_mtime_ns
    again, _ = predicted(cli, copy_run, ["1 2 3"])
    assert again == first and (entries[0] / "model.bin").stat().st_mtime_ns == written  # reused, not rebuilt
    int8, _ = predicted(cli, copy_run, ["1 2 3"], "--set", "decode.quantize=int8")
    assert len(list((tmp_path / "cache" / "engines").iterdir())) == 2  # another compute type: another entry
    assert sorted(p.name for p in copy_run.iterdir()) == before  # nothing written into the run directory


@needs_ct2
def test_a_damaged_cache_entry_is_rebuilt(cli, copy_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKFORMER_CACHE", str(tmp_path / "cache"))
    texts = held_out(3, 20, (1, 10))
    first, _ = predicted(cli, copy_run, texts, "--beam", "1")
    entry = next((tmp_path / "cache" / "engines").iterdir())
    whole = (entry / "model.bin").read_bytes()
    (entry / "model.bin").write_bytes(whole[: len(whole) // 2])  # a disk that filled up, a copy cut short
    again, _ = predicted(cli, copy_run, texts, "--beam", "1")
    assert again == first and (entry / "model.bin").read_bytes() == whole


@needs_ct2
def test_a_model_in_the_run_directory_is_never_loaded(cli, copy_run, tmp_path, monkeypatch):
    """An export left inside a run directory is not read: the runtime's model comes from the cache
    alone, keyed by the weights it was converted from (a model.bin beside the weights is refused as a
    pickle already)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(copy_run, run)
    for folder in ("ctranslate2", "engines"):
        assert cli("export", str(copy_run), "--to", "ctranslate2", str(run / folder)).exit_code == 0
        (run / folder / "model.bin").write_bytes(b"not a model")  # damaged where a careless loader would look
    monkeypatch.setenv("TASKFORMER_CACHE", str(tmp_path / "cache"))
    texts = held_out(4, 10, (1, 8))
    assert predicted(cli, run, texts, "--beam", "1")[0] == predicted(cli, copy_run, texts, "--beam", "1")[0]
    assert len(list((tmp_path / "cache" / "engines").iterdir())) == 1  # one network, one entry


@needs_ct2
def test_with_the_cache_off_the_conversion_leaves_nothing_behind(cli, copy_run, tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TASKFORMER_CACHE", "off")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    outputs, engine = predicted(cli, copy_run, ["1 2 3"])
    assert engine["engine"] == "ctranslate2" and outputs
    assert list(scratch.iterdir()) == []


def test_the_cache_entry_records_each_files_digest(tmp_path):
    folder = tmp_path / "entry"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"weights")
    assert not engines.whole(folder)  # no record: not an entry
    (folder / engines.ENTRY).write_text(json.dumps({"files": {"model.bin": engines._file_sha256(folder / "model.bin")}}))
    assert engines.whole(folder)
    (folder / "model.bin").write_bytes(b"weightz")
    assert not engines.whole(folder)


# -- a language model ---------------------------------------------------------------------------------------

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n") * 8


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    data = tmp_path_factory.mktemp("text")
    (data / "input.txt").write_text(TEXT, encoding="utf-8")
    settings = {"model.d_model": 32, "model.n_heads": 2, "model.dec_layers": 1, "model.d_ff": 64, "model.max_len": 24,
                "train.max_tokens": 64, "train.warmup": 5, "train.bf16": False, "decode.max_new_tokens": 12}
    return run_task("shakespeare-char", tmp_path_factory.mktemp("runs") / "lm", data_dir=data, steps=80,
                    settings=settings).dir


@needs_ct2
def test_a_language_models_greedy_continuations_equal_ours(cli, lm):
    prompts = ["Citizen:", "All: Speak", "Before we", "hear me"]
    ours, _ = predicted(cli, lm, prompts, "--beam", "1", "--set", "decode.engine=torch")
    theirs, engine = predicted(cli, lm, prompts, "--beam", "1")
    assert engine["engine"] == "ctranslate2" and [t["settings"]["engine"] for t in theirs] == ["ctranslate2"] * 4
    assert [t["continuation"] for t in theirs] == [o["continuation"] for o in ours]
    assert len({o["continuation"] for o in ours}) > 1
    # past model.max_len positions our decoder slides the context, which CTranslate2 cannot: those go to ours
    long, _ = predicted(cli, lm, prompts, "--beam", "1", "--set", "decode.max_new_tokens=40")
    assert [t["continuation"] for t in long] == [o["continuation"] for o in predicted(
        cli, lm, prompts, "--beam", "1", "--set", "decode.max_new_tokens=40", "--set", "decode.engine=torch")[0]]


# -- the server ----------------------------------------------------------------------------------------------

@needs_ct2
@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
@pytest.mark.slow  # starts a server process: the full run's, not the quick tier's
def test_the_server_decodes_with_the_engine_and_says_so(cli, copy_run, lm, engine):
    pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
    from test_serve import Server

    server = Server(f"copy={copy_run}", f"lm={lm}", "--set", f"decode.engine={engine}")
    try:
        described = {m["name"]: m for m in server.client.get("/v1/models").json()["models"]}
        assert {m["engine"]["engine"] for m in described.values()} == {engine}
        texts = held_out(5, 12, (1, 10))
        for beam in (1, 3):
            response = server.post("/v1/models/copy/predict", {"inputs": texts, "beam": beam})
            assert response.status_code == 200, response.text
            expected, _ = predicted(cli, copy_run, texts, "--beam", str(beam), "--set", f"decode.engine={engine}")
            assert [r["output"] for r in response.json()["results"]] == expected
        streamed = server.post("/v1/models/lm/predict/stream", {"inputs": ["Citizen:"]}).text
        events = [json.loads(line.removeprefix("data: ")) for line in streamed.splitlines() if line.startswith("data: ")]
        expected, _ = predicted(cli, lm, ["Citizen:"], "--set", f"decode.engine={engine}")
        assert events[-1]["output"] == expected[0]["continuation"] and events[-1]["settings"]["engine"] == engine
        pieces = [e["text"] for e in events[:-1]]
        assert len(pieces) > 1 and "".join(pieces) == expected[0]["continuation"]  # token by token
        refused = server.post("/v1/models/copy/predict", {"inputs": ["1 2"], "engine": "torch"})
        assert refused.status_code == 422 and refused.json()["field"] == "engine"  # the process's choice, not a request's
    finally:
        server.stop()

