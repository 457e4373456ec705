"""Token tagging, the third variant: word alignment, the per-token loss, and a tagging task through the CLI."""
import json

import pytest
import tagging_plugin
import torch
import torch.nn.functional as F
from test_hostile import one_error

import taskformer
from taskformer import BOS, ClassificationHead, Task, TaskData, characters, encode_words, hookimpl, symbols
from taskformer.core.data import IGNORE, collate, encode
from taskformer.core.loss import batch_loss
from taskformer.core.model import Transformer
from taskformer.core.model_config import ModelConfig


def test_each_word_is_tagged_at_its_first_token():
    tok = characters(["abc de f"])
    src, words, cut = encode_words(tok, ["abc de f", "  de   abc "], max_len=64)
    assert src[0][0] == BOS and len(src[0]) == 1 + 6  # whitespace is not a token of this tokenizer
    assert words == [[1, 4, 6], [1, 3]] and cut == 0
    src, words, cut = encode_words(tok, ["abc de f"], max_len=5)  # room for BOS and four tokens
    assert len(src[0]) == 5 and words == [[1, 4, -1]] and cut == 1


def test_tag_targets_sit_on_first_tokens_and_the_rest_is_ignored():
    data = TaskData(tokenizer=characters(["ab c"]), splits={"train": [("ab c", "Y X"), ("c", "X")]},
                        labels=["X", "Y"])
    enc = encode(data, "train", 16, "tagging")
    assert enc.tgt == [[IGNORE, 1, IGNORE, 0], [IGNORE, 0]]
    src, tgt = collate(enc, [0, 1])
    assert tgt.tolist() == [[IGNORE, 1, IGNORE, 0], [IGNORE, 0, IGNORE, IGNORE]]  # padded with IGNORE, not tag 0


def test_tagging_model_scores_every_position_and_the_loss_only_tagged_ones():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(variant="tagging", vocab_size=12, num_classes=3, d_model=16, n_heads=2,
                                    enc_layers=1, d_ff=32, dropout=0.0)).eval()
    src = torch.tensor([[BOS, 5, 6, 7], [BOS, 8, 0, 0]])
    tgt = torch.tensor([[IGNORE, 2, IGNORE, 0], [IGNORE, 1, IGNORE, IGNORE]])
    logits = model(src)
    assert logits.shape == (2, 4, 3)
    loss, count = batch_loss(model, src, tgt, 0.0)
    assert count == 3
    expected = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=IGNORE, reduction="sum")
    assert torch.allclose(loss, expected, rtol=1e-5)


def test_a_classifier_learns_a_distribution_as_it_learns_a_label():
    """Soft targets (a distillation's) give the loss of the one-hot label where they are one-hot, and
    otherwise the cross-entropy against the distribution, label smoothing included."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(variant="encoder-only", vocab_size=12, num_classes=3, d_model=16, n_heads=2,
                                    enc_layers=1, d_ff=32, dropout=0.0)).eval()
    data = TaskData(tokenizer=characters(["abc"]), labels=["X", "Y", "Z"],
                    splits={"train": [("ab", "Y"), ("cab", {"X": 0.5, "Y": 0.25, "Z": 0.25}), ("b", "Z")]})
    src, soft = collate(encode(data, "train", 16, "encoder-only"), [0, 1, 2])
    assert soft.tolist() == [[0, 1, 0], [0.5, 0.25, 0.25], [0, 0, 1]]
    loss, count = batch_loss(model, src, soft, 0.1)
    logp = torch.log_softmax(model(src), -1)
    smoothed = 0.9 * soft + 0.1 / 3
    assert count == 3 and torch.allclose(loss, -(smoothed * logp).sum(), rtol=1e-5)
    hard, _ = batch_loss(model, src[[0, 2]], torch.tensor([1, 2]), 0.1)
    assert torch.allclose(hard, -(smoothed[[0, 2]] * logp[[0, 2]]).sum(), rtol=1e-5)


@pytest.mark.slow
def test_a_tagging_task_trains_predicts_evaluates_and_reports_through_the_cli(register, cli, tmp_path):
    register(tagging_plugin, "truecase-fixture")
    out = tmp_path / "run"
    trained = cli("run", "truecase", "--out", str(out), "--quiet", "--set", "train.threads=1")
    assert trained.exit_code == 0, trained.output
    result = json.loads((out / "result.json").read_text())
    test = result["metrics"]["test"]
    # A rule that knows no words ("title" first, then "lower") scores about 75%; the rules of the data give 100%.
    assert test["token_accuracy"] >= 90.0 and test["exact_match"] >= 50.0, test
    rows = [json.loads(line) for line in (out / "outputs-test.jsonl").read_text().splitlines()]
    assert len(rows) == 100 and all(len(r["output"].split()) == len(r["source"].split()) for r in rows)
    assert "token_accuracy" in (out / "report.txt").read_text()
    one_error(cli("distill", str(out), "--out", str(tmp_path / "student"), "--quiet"), "tagger", "not built")
    assert not (tmp_path / "student").exists()

    lines = ["Anna met the BBC in London.", "", "the river " * 40]  # normalized for the model; the last is cut
    predicted = cli("predict", str(out), input="\n".join(lines) + "\n")
    assert predicted.exit_code == 0, predicted.output
    inputs, block = [], []  # WORD<TAB>TAG lines, a blank line after each input (the blank input: just that)
    for line in predicted.stdout.split("\n")[:-1]:
        if line:
            block.append(line.split("\t"))
        else:
            inputs, block = inputs + [block], []
    assert len(inputs) == 3 and inputs[1] == [] and block == []
    first, third = inputs[0], inputs[2]
    assert [word for word, _ in first] == lines[0].split()  # the user's words, "London." with its full stop
    assert first[0][1] == "title"
    assert len(third) == 80 and third[-1] == ["river", "lower"]  # words beyond max_len get TAGS[0]
    assert "truncated" in predicted.stderr
    as_json = cli("predict", str(out), "--json", lines[0], "")
    assert as_json.exit_code == 0, as_json.output
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == [[list(pair) for pair in first], []]

    model = taskformer.load(out)
    assert model.predict([lines[0], " "]) == [[tuple(pair) for pair in first], []]  # the API gives the pairs too
    assert model.evaluate("test") == pytest.approx(test)  # eval decodes the same way the run did
    evaluated = cli("eval", str(out), "--split", "test")
    assert evaluated.exit_code == 0 and "token_accuracy" in evaluated.stdout
    shown = cli("report", str(out))
    assert shown.exit_code == 0 and "token_accuracy" in shown.stdout


class BadTags:
    """A tagging task whose plugin gives one wrong answer, chosen by ``fault``."""

    def __init__(self, fault):
        self.fault = fault

    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="bad-tags", description="answers wrongly", variant="tagging", metric="token_accuracy",
                     defaults={"model": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "d_ff": 32}})]

    @hookimpl
    def taskformer_data(self):
        rows = [("a b", "X Y"), ("b a b", "Y X" if self.fault == "tags" else "Y X Y")]
        return TaskData(tokenizer=symbols(["a", "b"]), splits={"train": rows, "val": rows, "test": rows},
                        labels=["X", "Y"])

    @hookimpl
    def taskformer_head(self, model_config):
        if self.fault == "head":
            return ClassificationHead(model_config)  # one answer per input, not one per position


@pytest.mark.parametrize("fault, expected", [
    ("tags", "taskformer_data for task 'bad-tags': train row 1 has 3 words but 2 tags (a tagging target is one "
             "label per whitespace-separated source word)"),
    ("head", "taskformer_head for task 'bad-tags': head(hidden, src_mask) must return logits of shape (1, 3, 2) "
             "for this test batch, but gave (1, 2)"),
])
def test_a_wrong_tagging_answer_is_named(register, cli, tmp_path, fault, expected):
    register(BadTags(fault), "bad-tags-plugin")
    result = cli("run", "bad-tags", "--out", str(tmp_path / "r"), "--quiet")
    assert result.exit_code == 2
    assert result.stderr == f"Error: plugin 'bad-tags-plugin': {expected}\n"
