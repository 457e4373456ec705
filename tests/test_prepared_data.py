"""Prepared data that scales: encoded splits are flat uint16/int32 arrays, cached as memory-mapped
files under a key of what the preparation reads; a lazy split (a datasets.Dataset) runs as a
list does; and a cache that is missing, damaged or unusable costs time, never the run."""
import json
import os

import numpy as np
import pytest

from conftest import Reversing, run_reversing
from taskformer import TaskData, symbols
from taskformer.core.data import encode


@pytest.fixture
def plugin(register):
    return register(Reversing("prepared-reverse"), "prepared-reverse-plugin")


def run(cli, reverse_data, out, *more):
    return run_reversing(cli, "prepared-reverse", reverse_data, out, 3, *more)


def trained(out) -> dict:
    """What a run learned and scored: its metrics and the final validation loss it logged."""
    result = json.loads((out / "result.json").read_text())
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    return {"metrics": result["metrics"], "data": result["info"]["data"], "losses": losses}


def same_weights(a, b) -> bool:
    from safetensors.numpy import load_file

    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return first.keys() == second.keys() and all(np.array_equal(first[k], second[k]) for k in first)


def entries(cache):
    return sorted(p for p in (cache / "data").iterdir() if not p.name.startswith("."))


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning: data cache")]


def test_ids_are_uint16_where_the_vocabulary_fits_and_int32_beyond():
    rows = [("a b c", "c b a"), ("b", "b")]
    small = encode(TaskData(symbols(["a", "b", "c"]), {"train": rows}), "train", 16, "encoder-decoder")
    large = encode(TaskData(symbols(["a", "b", "c"] + [f"w{i}" for i in range(70_000)]), {"train": rows}),
                   "train", 16, "encoder-decoder")
    assert small.src.flat.dtype == np.uint16 and small.tgt.flat.dtype == np.uint16
    assert large.src.flat.dtype == np.int32 and large.tgt.flat.dtype == np.int32
    assert small.src == large.src == [[4, 5, 6, 2], [5, 2]]  # the same ids, framed [..., EOS]
    assert small.tgt == [[1, 6, 5, 4, 2], [1, 5, 2]]


def test_a_warm_cache_gives_the_same_batches_and_result_as_a_cold_one(cli, plugin, reverse_data, cache, tmp_path):
    cold = run(cli, reverse_data, tmp_path / "cold")
    warm = run(cli, reverse_data, tmp_path / "warm")
    assert plugin.calls == 1 and "reading the prepared data from the cache" in warm.stderr
    assert trained(tmp_path / "cold") == trained(tmp_path / "warm")
    assert same_weights(tmp_path / "cold", tmp_path / "warm")
    [entry] = entries(cache)
    [folder] = [p for p in entry.iterdir() if p.name.startswith("encoded-train")]
    assert np.load(folder / "src.ids.npy", mmap_mode="r").dtype == np.uint16
    assert not any(json.loads((entry / "data.json").read_text())["splits"].get("train", []))  # no text copy of train
    assert not warnings_of(cold) and not warnings_of(warm)


def test_a_lazy_split_runs_as_a_list_does(cli, plugin, reverse_data, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKFORMER_CACHE", "off")
    run(cli, reverse_data, tmp_path / "lists")
    plugin.lazy = True
    run(cli, reverse_data, tmp_path / "lazy")
    assert plugin.calls == 2
    assert trained(tmp_path / "lists") == trained(tmp_path / "lazy")
    assert same_weights(tmp_path / "lists", tmp_path / "lazy")


def test_the_key_ignores_training_options(cli, plugin, reverse_data, cache, tmp_path):
    dry = cli("run", "prepared-reverse", "--data-dir", str(reverse_data), "--dry-run")
    assert dry.exit_code == 0, dry.output
    run(cli, reverse_data, tmp_path / "a", "--set", "train.lr=0.002", "--set", "model.d_ff=32")
    assert plugin.calls == 1
    run(cli, reverse_data, tmp_path / "b", "--seed", "4")  # the seed may choose rows: a new entry
    assert plugin.calls == 2


@pytest.mark.parametrize("where", ["file", "/dev/null", "read-only", "too long"])
def test_an_unusable_cache_folder_costs_time_not_the_run(cli, plugin, reverse_data, tmp_path, monkeypatch, where):
    if where == "file":
        (tmp_path / "a-file").write_text("not a folder")
        path = str(tmp_path / "a-file")
    elif where == "read-only":
        if os.geteuid() == 0:  # root writes anywhere it may chmod: /proc is what no one may write
            path = "/proc/taskformer-cache"
        else:
            (tmp_path / "ro").mkdir(mode=0o500)
            path = str(tmp_path / "ro")
    elif where == "too long":
        path = str(tmp_path / ("x" * 300))
    else:
        path = where
    monkeypatch.setenv("TASKFORMER_CACHE", path)
    first = run(cli, reverse_data, tmp_path / "a")
    second = run(cli, reverse_data, tmp_path / "b")
    assert plugin.calls == 2
    assert len(warnings_of(first)) == 1 and len(warnings_of(second)) <= 1  # once a process: the same line is not repeated
    assert trained(tmp_path / "a") == trained(tmp_path / "b")


def damage_truncated(entry):
    ids = next(entry.glob("encoded-train-*/src.ids.npy"))
    ids.write_bytes(ids.read_bytes()[:-7])


def damage_tampered(entry):
    ids = next(entry.glob("encoded-train-*/src.ids.npy"))
    raw = bytearray(ids.read_bytes())
    raw[-2] ^= 0x01
    ids.write_bytes(bytes(raw))


def damage_out_of_range(entry):
    """Ids past the vocabulary, with the checksum made to match: only the range check finds them."""
    import hashlib

    folder = next(entry.glob("encoded-train-*"))
    ids = np.load(folder / "src.ids.npy")
    ids[0] = 60_000
    np.save(folder / "src.ids.npy", ids)
    meta = json.loads((folder / "meta.json").read_text())
    meta["arrays"]["src.ids"]["sha256"] = hashlib.sha256((folder / "src.ids.npy").read_bytes()).hexdigest()
    (folder / "meta.json").write_text(json.dumps(meta))


def damage_emptied(entry):
    (entry / "data.json").write_text("")


@pytest.mark.parametrize("damage", [damage_truncated, damage_tampered, damage_out_of_range, damage_emptied])
def test_a_damaged_entry_is_rebuilt(cli, plugin, reverse_data, cache, tmp_path, damage):
    run(cli, reverse_data, tmp_path / "a")
    [entry] = entries(cache)
    damage(entry)
    rebuilt = run(cli, reverse_data, tmp_path / "b")
    assert plugin.calls == 2
    assert len(warnings_of(rebuilt)) == 1 and "made again" in warnings_of(rebuilt)[0]
    assert trained(tmp_path / "a") == trained(tmp_path / "b")
    warm = run(cli, reverse_data, tmp_path / "c")  # and the entry made again is used
    assert plugin.calls == 2 and not warnings_of(warm)


def test_a_swapped_entry_is_not_trusted(cli, plugin, reverse_data, cache, tmp_path):
    run(cli, reverse_data, tmp_path / "a")
    run(cli, reverse_data, tmp_path / "b", "--seed", "4")
    first, second = entries(cache)
    first.rename(cache / "data" / "swap")
    second.rename(first)
    (cache / "data" / "swap").rename(second)
    run(cli, reverse_data, tmp_path / "c")
    assert plugin.calls == 3  # read again, not served the other seed's rows
    assert trained(tmp_path / "a") == trained(tmp_path / "c")


def test_pruning_keeps_the_size_cap_and_leaves_other_folders_alone(cli, plugin, reverse_data, cache, tmp_path, monkeypatch):
    run(cli, reverse_data, tmp_path / "a")
    mine = cache / "data" / "0123456789abcdef0123456789abcdef"  # named like an entry, marked, but not the cache's
    mine.mkdir()
    (mine / ".taskformer-data").write_text("{}")
    (mine / "notes.txt").write_text("keep me")
    monkeypatch.setenv("TASKFORMER_CACHE_GB", "0.000001")  # a byte cap below one entry: only the newest stays
    run(cli, reverse_data, tmp_path / "b", "--seed", "4")
    assert len(entries(cache)) == 2 and (mine / "notes.txt").read_text() == "keep me"


def test_data_too_large_for_memory_is_refused_before_it_is_read(cli, plugin, reverse_data, cache, monkeypatch):
    from taskformer.app import resources

    monkeypatch.setattr(resources, "available_memory", lambda: 1000)  # bytes: less than the file's text needs
    result = cli("run", "prepared-reverse", "--data-dir", str(reverse_data), "--set", "train.max_steps=1")
    assert result.exit_code == 2 and plugin.calls == 0
    [line] = result.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"Error: --data-dir {reverse_data}: preparing its") and "memory" in line


LM_TEXT = "".join(f"Paragraph {i}: the cat sat on the mat, and the dog sat on the log.\n\n" for i in range(60))
LM_TINY = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.dec_layers=1",
           "--set", "model.d_ff=64", "--set", "model.max_len=16", "--set", "train.max_tokens=64",
           "--set", "train.bf16=false", "--set", "train.max_steps=3"]


def test_an_lm_split_gives_each_row_the_scores_a_row_id_per_token_would():
    """A language model's blocks cut across rows; the (row, count) runs that give their scores back to the
    rows agree with a row id per target, found here from the text itself, for running text and a prompt."""
    from types import SimpleNamespace

    import torch

    from taskformer import characters
    from taskformer.core import variants
    from taskformer.core.scoring import reference_logprobs
    from taskformer.core.tokenize import EOS
    from taskformer.core.train_config import TrainConfig

    rows = [("", "the cat sat.\n\n"), ("", ""), ("", "a dog ran far away, and on.\n\n"), ("Q: ", "yes"), ("", "end\n")]
    tok = characters([text for _, text in rows] + ["Q: "], whitespace=True)
    vocab = tok.get_vocab_size()

    class Stub(torch.nn.Module):  # a token's logits from the token before it alone: scores known in advance
        cfg = SimpleNamespace(kind=variants.of("decoder-only"))

        def forward(self, src):
            return ((src.unsqueeze(-1) * 7 + torch.arange(vocab)) % 11).float()

    def score(before: int, after: int) -> float:
        return torch.log_softmax(((before * 7 + torch.arange(vocab)) % 11).float(), -1)[after].item()

    expected: list[list[float]] = [[] for _ in rows]
    stream = [(i, t) for i, (_, text) in enumerate(rows) if not _ for t in tok.encode(text).ids]
    for (_, before), (owner, after) in zip(stream, stream[1:]):
        expected[owner].append(score(before, after))
    prompt, text = tok.encode(rows[3][0]).ids, tok.encode(rows[3][1]).ids
    ids = prompt + text + [EOS]
    expected[3] = [score(ids[j - 1], ids[j]) for j in range(len(prompt), len(ids))]

    enc = encode(TaskData(tok, {"val": rows}), "val", 4, "decoder-only")
    got = reference_logprobs(Stub(), enc, len(rows), TrainConfig(max_tokens=16, bf16=False), torch.device("cpu"))
    assert [len(r) for r in got] == [len(r) for r in expected] and len(got[0]) > 4  # rows cross blocks
    assert all(a == pytest.approx(b) for a, b in zip(got, expected))
    assert enc.owners is not None and enc.owners.shape == (4, 2)  # a run per scored row, not an id per token


def test_an_lm_warm_cache_maps_its_stream_and_trains_as_a_cold_one(cli, cache, tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    (data / "input.txt").write_text(LM_TEXT)

    def lm(out, *more):
        result = cli("run", "lm", "--data", str(data), "--out", str(tmp_path / out), *LM_TINY, *more)
        assert result.exit_code == 0, result.output
        return result

    cold, warm = lm("cold"), lm("warm")
    assert "reading the prepared data from the cache" in warm.stderr
    assert trained(tmp_path / "cold") == trained(tmp_path / "warm")
    assert same_weights(tmp_path / "cold", tmp_path / "warm")
    [entry] = entries(cache)
    [train] = entry.glob("encoded-train-*")
    stream = np.load(train / "stream.npy", mmap_mode="r")
    assert stream.dtype == np.uint16 and len(stream) > 0.85 * len(LM_TEXT)
    [val] = entry.glob("encoded-val-*")
    owners = np.load(val / "owners.npy")
    assert owners.shape[1] == 2 and owners[:, 1].sum() == np.load(val / "src.ids.npy").size - 1  # every token but the first
    assert len(owners) < 10  # a (row, count) run per paragraph held out, not a row id per token
    assert not warnings_of(cold) and not warnings_of(warm)

    mark = entry / ".taskformer-data"  # an entry of another format is made again, never read
    mark.write_text(json.dumps({**json.loads(mark.read_text()), "format": 2}))
    rebuilt = lm("rebuilt")
    assert len(warnings_of(rebuilt)) == 1 and "made again" in warnings_of(rebuilt)[0]
    assert trained(tmp_path / "cold") == trained(tmp_path / "rebuilt")
