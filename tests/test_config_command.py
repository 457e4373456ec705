"""`taskformer config` prints every option with its help and range, and `run --dry-run` trains nothing."""
import json

import pytest
import tagging_plugin


def test_config_lists_every_key_with_its_help_and_reads_back_as_a_config_file(cli, tmp_path):
    shown = cli("config", "copy", "--set", "train.lr=0.002", "--set", "data.length=7")
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert "lr = 0.002\n" in text and "length = 7\n" in text
    assert "# Stop after this many updates; 0: no limit. The budget that gives the same run on a busy machine" in text
    assert "(int, at least 1, default 10)" in text  # data.length: type, range and the task's default
    saved = tmp_path / "copy.toml"
    saved.write_text(text)
    again = cli("config", "copy", "--config", str(saved))
    assert again.exit_code == 0 and again.stdout == text  # the listing is a config file --config reads back


def test_config_json_gives_type_default_value_range_and_help(cli):
    shown = cli("config", "copy", "--json", "--set", "model.d_model=32")
    assert shown.exit_code == 0, shown.output
    options = {row["key"]: row for row in json.loads(shown.stdout)["options"]}
    assert options["model.d_model"] == {"key": "model.d_model", "type": "int", "default": 64, "value": 32,
                                        "allowed": "above 0", "help": "Width of every layer (the embedding size)."}
    assert options["train.cooldown"]["allowed"] == "[0, 1)"
    assert options["decode.strategy"]["allowed"] == "beam or greedy"


def test_a_tagger_config_lists_no_search_options(cli, register):
    register(tagging_plugin, "truecase-fixture")
    keys = {row["key"] for row in json.loads(cli("config", "truecase", "--json").stdout)["options"]}
    assert {"decode.batch_size", "model.members", "train.max_steps"} <= keys
    assert not keys & {"decode.beam", "decode.strategy", "decode.length_penalty", "model.dec_layers", "model.pooling"}


def test_an_unknown_key_lists_the_keys_of_its_section(cli):
    bad = cli("config", "copy", "--set", "data.lenght=3")
    assert bad.exit_code == 2
    assert bad.stderr.strip() == ("Error: --set: unknown config key 'data.lenght' (did you mean 'data.length'?); "
                                  "the data keys: vocab, length, train_size, val_size, test_size")
    out_of_range = cli("config", "copy", "--set", "decode.beam=0")
    assert out_of_range.exit_code == 2 and "decode.beam must be at least 1, got 0" in out_of_range.stderr


@pytest.mark.slow
def test_dry_run_checks_and_describes_the_run_but_trains_nothing(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r"
    checked = cli("run", "copy", "--dry-run", "--out", str(out), "--quiet", "--set", "train.max_steps=30",
                  "--set", "data.train_size=500")
    assert checked.exit_code == 0, checked.output
    lines = dict(line.split(": ", 1) for line in checked.stdout.splitlines())
    assert lines["task"].startswith("copy (encoder-decoder")
    assert lines["model"].startswith("d_model 64, 4 heads, 2+2 layers") and lines["model"].endswith(" parameters")
    assert lines["data"] == "train 500, val 500, test 1,000"
    # 500 rows of 10 symbols fill five 1,200-token batches: the epochs end before train.max_steps
    assert lines["budget"] == ("2 epochs of 5 updates; at most 30 updates (train.max_steps); planned 10 updates, "
                               "the first 100 warming up")
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_dry_run_refuses_what_the_run_would_refuse(cli, tmp_path):
    too_big = cli("run", "copy", "--dry-run", "--quiet", "--set", "model.d_model=1099511627776",
                  "--set", "model.n_heads=1")
    assert too_big.exit_code == 2 and "does not fit in memory" in too_big.stderr
    resumed = cli("run", "--resume", str(tmp_path), "--dry-run")
    assert resumed.exit_code == 2 and "--dry-run" in resumed.stderr
