"""Prepared data is cached by the data files' digest and the settings: a second run reads it back
instead of calling the data hook, and a changed file or setting is never served from the cache."""
import json

import pytest

from conftest import Reversing, run_reversing

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's


@pytest.fixture
def plugin(register):
    return register(Reversing("cache-reverse"), "cache-reverse-plugin")


def run(cli, reverse_data, out, *more):
    return run_reversing(cli, "cache-reverse", reverse_data, out, 2, *more)


def test_a_second_run_reads_the_prepared_data_from_the_cache(cli, plugin, reverse_data, cache, tmp_path):
    first = run(cli, reverse_data, tmp_path / "a")
    second = run(cli, reverse_data, tmp_path / "b")
    assert plugin.calls == 1
    assert "reading the prepared data from the cache" in second.stderr
    assert "reading the prepared data from the cache" not in first.stderr
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("a", "b"))
    assert a["metrics"] == b["metrics"] and a["info"]["data"] == b["info"]["data"]
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_a_changed_file_or_setting_is_not_served_from_the_cache(cli, plugin, reverse_data, cache, tmp_path):
    run(cli, reverse_data, tmp_path / "a")
    with open(reverse_data / "pairs.tsv", "a") as f:
        f.write("1 2 3\t3 2 1\n")
    run(cli, reverse_data, tmp_path / "b")
    assert plugin.calls == 2
    assert json.loads((tmp_path / "b" / "result.json").read_text())["info"]["data"]["train"] == 41
    run(cli, reverse_data, tmp_path / "c", "--seed", "3")  # the hook sees the whole config: a new key
    assert plugin.calls == 3


def test_a_damaged_cache_entry_is_made_again(cli, plugin, reverse_data, cache, tmp_path):
    run(cli, reverse_data, tmp_path / "a")
    [entry] = [p for p in (cache / "data").iterdir() if not p.name.startswith(".")]
    (entry / "data.json").write_text("{not json")
    run(cli, reverse_data, tmp_path / "b")
    assert plugin.calls == 2


def test_the_cache_can_be_turned_off(cli, plugin, reverse_data, monkeypatch, tmp_path):
    monkeypatch.setenv("TASKFORMER_CACHE", "off")
    run(cli, reverse_data, tmp_path / "a")
    run(cli, reverse_data, tmp_path / "b")
    assert plugin.calls == 2
