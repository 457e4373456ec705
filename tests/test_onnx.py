"""ONNX for classifiers and taggers: ``export --to onnx`` checked against our logits, and
``decode.engine=onnxruntime`` (or ``auto``) for predict, eval, the Python API and serve."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import tagging_plugin
import torch
from click.testing import CliRunner

import taskformer
from taskformer.app.cli import main
from taskformer.core import onnx_export
from taskformer.core.export import ExportError
from taskformer.core.model import Transformer
from taskformer.core.model_config import ModelConfig
from taskformer.core.tokenize import symbols
from taskformer.plugins.manager import plugins

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxscript", "onnxruntime")),
    reason="onnx, onnxscript or onnxruntime is not installed (pip install taskformer[export])")
HERE = Path(__file__).parent
NEWS = ["Rebels meet in Geneva, officials said", "The team won the final match of the season",
        "Shares fell as the bank reported losses", "A new chip doubles battery life", "", "Oil prices rise"]
CASING = ["anna met tom in paris", "the bbc saw a train near rome", "", "nasa flew to oslo after the eu met"]
TINY = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.d_ff=64", "train.threads=1",
        "train.bf16=false"]


def train(out: Path, task: str, *options: str, data: str | None = None) -> Path:
    where = ["--data-dir", str(HERE / "data" / data)] if data else []
    result = CliRunner().invoke(main, ["run", task, *where, "--out", str(out), "--quiet",
                                       *(a for o in [*TINY, *options] for a in ("--set", o))], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    plugins().pm.register(tagging_plugin, name="truecase-fixture")
    plugins().refresh()
    yield {"agnews": train(root / "agnews", "agnews", "train.epochs=3", "data.vocab_size=300", "model.members=1",
                           data="ag_news"),
           "truecase": train(root / "truecase", "truecase", "train.max_steps=20")}
    plugins().pm.unregister(name="truecase-fixture")
    plugins().refresh()


def predicted(cli, run: Path, texts: list[str], *args: str) -> tuple[list, dict]:
    result = cli("predict", str(run), "--json", *args, input="\n".join(texts) + "\n")
    assert result.exit_code == 0, result.stderr
    engine = json.loads(result.stderr.split("engine: ", 1)[1].splitlines()[0])
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return lines, engine


def test_export_writes_a_model_whose_logits_are_ours_for_any_batch_and_length(cli, runs, tmp_path):
    import onnx
    import onnxruntime

    for name, run in runs.items():
        out = tmp_path / name
        result = cli("export", str(run), "--to", "onnx", str(out))
        assert result.exit_code == 0, result.stderr
        assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "taskformer.json", "tokenizer.json"]
        manifest = json.loads((out / "taskformer.json").read_text())
        assert manifest["opset"] == onnx_export.OPSET and manifest["largest_logit_difference"] <= onnx_export.TOLERANCE
        network = taskformer.load(run).network
        graph = onnx.load(str(out / "model.onnx")).graph
        attention = [{a.name for a in node.attribute} for node in graph.node if node.op_type == "Attention"]
        assert len(attention) == network.cfg.enc_layers and "Softmax" not in [node.op_type for node in graph.node]
        assert all({"q_num_heads", "kv_num_heads"} <= names for names in attention)  # on widths: no transposes
        session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
        for batch, length in [(1, 3), (7, 30), (2, network.cfg.max_len)]:
            src = onnx_export.probe(network, batch, length, padded=True, seed=batch)
            with torch.no_grad():
                ours = network(src).numpy()
            theirs = session.run(None, {"src": src.numpy()})[0]
            assert theirs.shape == ours.shape and abs(theirs - ours).max() < 1e-4, (name, batch, length)


@pytest.mark.parametrize("pooling", ["mean", "max", "first"])
def test_the_engines_graph_for_rows_of_one_length_gives_our_logits_without_a_padding_mask(pooling, tmp_path):
    """``decode.engine`` hands ONNX Runtime batches of one length: its graph makes no padding mask, and
    its logits, and a classifier's probabilities, are ours on such batches, for each pooling; a batch
    of several lengths is not its to run."""
    import onnx
    import onnxruntime

    from taskformer.core.decode_config import DecodeConfig
    from taskformer.core.runtimes import OnnxNetwork

    cfg = ModelConfig(variant="encoder-only", vocab_size=40, d_model=32, n_heads=2, d_ff=64, enc_layers=2,
                      dec_layers=0, max_len=24, num_classes=3, pooling=pooling)
    network = Transformer(cfg).eval()
    assert onnx_export.build(network, tmp_path / "model.onnx", engine=True) <= onnx_export.TOLERANCE
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    nodes = graph.node
    assert [o.name for o in graph.output] == ["logits", "probabilities"]
    assert [len(n.input) for n in nodes if n.op_type == "Attention"] == [3, 3]  # query, key, value: no mask
    assert not {"Equal", "Not", "Expand"} & {n.op_type for n in nodes}
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in [(1, 2), (3, 17), (2, cfg.max_len)]:
        src = onnx_export.probe(network, batch, length, padded=False, seed=batch)
        with torch.no_grad():
            ours = network(src)
        logits, probabilities = session.run(None, {"src": src.numpy()})
        assert abs(logits - ours.numpy()).max() < 1e-4, (batch, length)
        assert abs(probabilities - ours.softmax(-1).numpy()).max() < 1e-6, (batch, length)
    runtime = OnnxNetwork(tmp_path / "model.onnx", cfg, "cpu")
    assert runtime.fits([[1, 5, 6], [1, 7, 8]], DecodeConfig()) and not runtime.fits([[1, 5, 6], [1, 7]], DecodeConfig())


def test_exporting_leaves_the_network_to_the_threads_decoding_with_it(tmp_path):
    """A time-limited run times ONNX Runtime on two threads at once: one converts the network while the
    other scores references with it. The exporter traces with fake weights swapped in, so it must
    trace a copy: the network given is never run by the export, and keeps its mode."""
    cfg = ModelConfig(variant="encoder-only", vocab_size=40, d_model=32, n_heads=2, d_ff=64, enc_layers=2,
                      dec_layers=0, max_len=24, num_classes=3)
    network = Transformer(cfg).train()
    ran: list[bool] = []
    network.register_forward_pre_hook(lambda module, args: ran.append(module is network))
    assert onnx_export.build(network, tmp_path / "model.onnx", engine=True) <= onnx_export.TOLERANCE
    assert ran and not any(ran)  # the copy ran (traced and checked), the network given never did
    assert network.training and all(type(p) is torch.nn.Parameter for p in network.parameters())


def test_an_export_whose_logits_differ_is_refused_and_nothing_is_written(tmp_path):
    class Drifting(torch.nn.Module):
        """A head that computes otherwise when traced: what an exporter's bug would look like."""

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 3)

        def forward(self, h, src_mask=None):
            logits = self.proj(h[:, 0])
            return logits * 1.01 if torch.compiler.is_exporting() else logits

    cfg = ModelConfig(variant="encoder-only", vocab_size=20, d_model=32, n_heads=2, d_ff=64, enc_layers=1,
                      dec_layers=0, max_len=16, num_classes=3)
    with pytest.raises(ExportError, match=r"logits differ from taskformer's by .* nothing was written"):
        onnx_export.to_onnx(Transformer(cfg, Drifting()), symbols([f"t{i}" for i in range(4, 20)]), tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert [p.name for p in tmp_path.iterdir() if p.name != "out"] == []  # no staging folder left


def test_a_searched_model_is_sent_to_ctranslate2(cli, finished, tmp_path):
    result = cli("export", str(finished), "--to", "onnx", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: ONNX export is for encoder-only and tagging models; this one is "
                                     "encoder-decoder (export it to CTranslate2: --to ctranslate2)")


def test_onnxruntime_labels_and_tags_equal_ours(cli, runs):
    for name, texts in [("agnews", NEWS), ("truecase", CASING)]:
        ours, torch_engine = predicted(cli, runs[name], texts, "--set", "decode.engine=torch")
        theirs, engine = predicted(cli, runs[name], texts)
        assert torch_engine["engine"] == "torch" and engine["engine"] == "onnxruntime", name
        assert engine["reason"] == "auto: onnxruntime is installed and runs this network"
        if name == "agnews":
            assert [t["label"] for t in theirs] == [o["label"] for o in ours]
            assert [t["probability"] for t in theirs] == pytest.approx([o["probability"] for o in ours], abs=1e-5)
        else:
            assert theirs == ours
        int8, engine = predicted(cli, runs[name], texts, "--set", "decode.quantize=int8")
        assert engine == {"engine": "onnxruntime", "compute_type": "int8",
                          "reason": "auto: onnxruntime is installed and runs this network"}
        assert len(int8) == len(ours)


def test_eval_and_the_api_decode_with_onnxruntime(cli, runs):
    # The last: batches of 2 decoded side by side by two workers, each calling ONNX Runtime at once.
    settings = {"onnxruntime": [], "torch": [], "parallel": ["decode.workers=2", "decode.batch_size=2"]}
    for name in runs:
        scores = {}
        for how, extra in settings.items():
            engine = "onnxruntime" if how == "parallel" else how
            result = cli("eval", str(runs[name]), "--split", "test", "--json", "--set", f"decode.engine={engine}",
                         *(a for s in extra for a in ("--set", s)))
            assert result.exit_code == 0, result.stderr
            evaluated = json.loads(result.stdout)
            assert evaluated["engine"]["engine"] == engine
            scores[how] = {k: v for k, v in evaluated["metrics"]["test"].items() if k != "loss"}
        assert scores["onnxruntime"] == scores["torch"] == scores["parallel"], name
    model = taskformer.load(runs["agnews"])
    assert model.engine()["engine"] == "onnxruntime"
    assert [p.label for p in model.predict(NEWS)] == [p.label for p in model.predict(NEWS, engine="torch")]
    with pytest.raises(taskformer.TaskformerError, match="decode.engine=ctranslate2: it decodes encoder-decoder"):
        model.predict(NEWS, engine="ctranslate2")


def test_a_classifier_on_onnxruntime_runs_no_torch_operator(runs):
    """Once its runtime is loaded, ONNX Runtime's predict runs no torch operator: none of torch's
    OpenMP threads wakes (and spins) beside the runtime's, as in a process that decodes with torch."""
    from torch.profiler import ProfilerActivity, profile

    model = taskformer.load(runs["agnews"])
    model.predict(NEWS[:1])  # converts into the cache, or loads the entry
    with profile(activities=[ProfilerActivity.CPU]) as onnx:
        predictions = model.predict(NEWS)
    with profile(activities=[ProfilerActivity.CPU]) as ours:
        model.predict(NEWS, engine="torch")
    assert len(predictions) == len(NEWS) and [e.key for e in onnx.key_averages()] == []
    assert any(e.key.startswith("aten::") for e in ours.key_averages())  # the profiler sees torch's operators


def test_a_tie_between_classes_goes_to_the_first_class():
    """Labels are read from probabilities in numpy (ONNX Runtime's come as numpy): a tie picks the
    first of the tied classes, as torch's max does."""
    class Tied(torch.nn.Module):
        def forward(self, src):
            return torch.tensor([[0.5, 2.0, 2.0, -1.0]] * len(src))

    labels = taskformer.best_labels(Tied(), torch.ones(2, 3, dtype=torch.long), ["a", "b", "c", "d"])
    assert [p.label for p in labels] == ["b", "b"]
    assert labels[0].probability == pytest.approx(torch.softmax(torch.tensor([0.5, 2.0, 2.0, -1.0]), 0)[1].item())


def test_without_onnxruntime_auto_uses_torch_and_export_says_what_to_install(cli, runs, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    _, engine = predicted(cli, runs["agnews"], NEWS[:2])
    assert engine["engine"] == "torch" and "onnxruntime is not installed (pip install taskformer[export])" in \
        engine["reason"]
    result = cli("export", str(runs["agnews"]), "--to", "onnx", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert result.stderr.strip() == "Error: exporting to ONNX needs the onnxruntime package: pip install taskformer[export]"


@pytest.mark.slow  # starts a server process: the full run's, not the quick tier's
def test_the_server_classifies_with_onnxruntime(cli, runs):
    pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
    from test_serve import Server

    server = Server(f"agnews={runs['agnews']}", f"truecase={runs['truecase']}")
    try:
        described = {m["name"]: m for m in server.client.get("/v1/models").json()["models"]}
        assert {m["engine"]["engine"] for m in described.values()} == {"onnxruntime"}
        for name, texts in [("agnews", NEWS), ("truecase", CASING)]:
            response = server.post(f"/v1/models/{name}/predict", {"inputs": texts})
            assert response.status_code == 200, response.text
            expected, _ = predicted(cli, runs[name], texts)
            results = response.json()["results"]
            assert [r["output"] for r in results] == expected
            if name == "agnews":  # the page's bars come from the same network: its best is the label's probability
                assert [max(r["probabilities"].values()) if r["probabilities"] else 0.0 for r in results] == \
                    pytest.approx([r["output"]["probability"] for r in results], abs=1e-6)
    finally:
        server.stop()
