"""Robustness, round five's remaining cases: each record states what ran (predict's search, a compile
that failed), damaged run and cache files, a language model's report samples, a CSV the reader cannot
parse, and a full disk while a run writes -- one ``Error:`` line naming the file, never a traceback,
never lost work."""

import json

import pytest

from conftest import TINY

# -- each record states what ran -------------------------------------------------------------------------------


def test_predict_json_states_the_search_that_ran_with_its_options(cli, finished):
    """``predict --json --beam 2`` (or ``--set decode.temperature``) changed the search, and nothing
    said so: an encoder-decoder's outputs are bare strings and stderr named the engine alone."""
    def search(*options):
        result = cli("predict", str(finished), "1 2 3", "--json", *options)
        assert result.exit_code == 0, result.output
        return json.loads(result.stderr.split("search: ", 1)[1].splitlines()[0])

    beam = search("--beam", "2")
    assert (beam["strategy"], beam["beam"]) == ("beam", 2)
    sampled = search("--set", "decode.temperature=0.5", "--set", "decode.seed=4")
    assert (sampled["strategy"], sampled["temperature"], sampled["seed"]) == ("sample", 0.5, 4)


@pytest.fixture
def failing_compiler(monkeypatch):
    """A compiler that fails at the first step, as Inductor does without a C++ compiler."""
    import torch

    def compiled(fn, **_):
        def step(*args, **kwargs):
            raise RuntimeError("no C++ compiler here")
        return step

    monkeypatch.setattr(torch, "compile", compiled)


def test_a_compile_that_failed_is_recorded_as_decoding_without_it(cli, finished, tmp_path, failing_compiler):
    """``decode.compile=true`` whose compiler failed decodes without it (a warning says so), but the
    run's record and eval's search said only what was asked for."""
    evaluated = cli("eval", str(finished), "--split", "val", "--json", "--set", "decode.compile=true",
                    "--set", "decode.engine=torch")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["search"]["compile"].startswith("failed (RuntimeError: no C++ compiler here)")
    out = tmp_path / "run"
    ran = cli("run", "copy", "--out", str(out), *TINY, "--set", "decode.compile=true")
    assert ran.exit_code == 0, ran.output
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["compile"] == "failed (RuntimeError: no C++ compiler here); decoded without it", info
