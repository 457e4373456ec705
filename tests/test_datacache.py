"""Prepared data is cached by the data files' digest and the settings: a second run reads it back
instead of calling the data hook, and a changed file or setting is never served from the cache."""
import json

import pytest

from taskformer import Task, TaskData, hookimpl, read_tsv, symbols

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's

SMALL = {"d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 64, "dropout": 0.0, "max_len": 16}


class Reversing:
    """Reverse digit strings read from DIR/pairs.tsv; counts how often its data hook runs."""

    TASK = Task("cache-reverse", "Reverse digits read from a file", metric="exact_match",
                defaults={"model": SMALL, "train": {"epochs": 1, "max_tokens": 256, "warmup": 2, "threads": 1}})

    def __init__(self):
        self.calls = 0

    @hookimpl
    def taskformer_tasks(self):
        return [self.TASK]

    @hookimpl
    def taskformer_data(self, config, data_dir):
        self.calls += 1
        pairs = read_tsv(data_dir / "pairs.tsv")
        return TaskData(tokenizer=symbols(list("0123456789")), splits={"train": pairs, "val": pairs[:4],
                                                                       "test": pairs[4:8]})

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        return {"exact_match": 100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references)}


@pytest.fixture
def plugin(register):
    return register(Reversing(), "cache-reverse-plugin")


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [" ".join(f"{(i * 7 + j) % 10}" for j in range(5)) for i in range(40)]
    (folder / "pairs.tsv").write_text("".join(f"{r}\t{' '.join(reversed(r.split()))}\n" for r in rows))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TASKFORMER_CACHE", str(folder))
    return folder


def run(cli, data_dir, out, *more):
    result = cli("run", "cache-reverse", "--data-dir", str(data_dir), "--out", str(out), "--set",
                 "train.max_steps=2", *more)
    assert result.exit_code == 0, result.output
    return result


def test_a_second_run_reads_the_prepared_data_from_the_cache(cli, plugin, data_dir, cache, tmp_path):
    first = run(cli, data_dir, tmp_path / "a")
    second = run(cli, data_dir, tmp_path / "b")
    assert plugin.calls == 1
    assert "reading the prepared data from the cache" in second.stderr
    assert "reading the prepared data from the cache" not in first.stderr
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("a", "b"))
    assert a["metrics"] == b["metrics"] and a["info"]["data"] == b["info"]["data"]
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_a_changed_file_or_setting_is_not_served_from_the_cache(cli, plugin, data_dir, cache, tmp_path):
    run(cli, data_dir, tmp_path / "a")
    with open(data_dir / "pairs.tsv", "a") as f:
        f.write("1 2 3\t3 2 1\n")
    run(cli, data_dir, tmp_path / "b")
    assert plugin.calls == 2
    assert json.loads((tmp_path / "b" / "result.json").read_text())["info"]["data"]["train"] == 41
    run(cli, data_dir, tmp_path / "c", "--seed", "3")  # the hook sees the whole config: a new key
    assert plugin.calls == 3


def test_a_damaged_cache_entry_is_made_again(cli, plugin, data_dir, cache, tmp_path):
    run(cli, data_dir, tmp_path / "a")
    [entry] = [p for p in (cache / "data").iterdir() if not p.name.startswith(".")]
    (entry / "data.json").write_text("{not json")
    run(cli, data_dir, tmp_path / "b")
    assert plugin.calls == 2


def test_the_cache_can_be_turned_off(cli, plugin, data_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("TASKFORMER_CACHE", "off")
    run(cli, data_dir, tmp_path / "a")
    run(cli, data_dir, tmp_path / "b")
    assert plugin.calls == 2
