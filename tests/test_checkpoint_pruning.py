"""Pruning old checkpoints removes only what taskformer wrote: never a folder of the user's, never
through a link, and an entry that merely looks like a checkpoint is named and left alone."""
import json
import shutil

import pytest

from conftest import TINY

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

# Four updates, a checkpoint after each, the newest two kept: a resume from step 3 writes step 4 and prunes.
FOUR = [*TINY, "--set", "train.epochs=4", "--set", "train.max_steps=4", "--set", "train.save_every=1",
        "--set", "train.keep_last=2"]


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    from conftest import run_here

    out = tmp_path_factory.mktemp("four") / "run"
    assert run_here("run", "copy", "--out", str(out), *FOUR).returncode == 0
    return out


def crashed_at_step_3(four_steps, dst):
    """A copy of the run as a crash after its third checkpoint leaves it."""
    run = shutil.copytree(four_steps, dst)
    (run / "result.json").unlink()
    shutil.rmtree(run / "checkpoints" / "step-000000004")
    return run


def test_resume_refuses_a_checkpoints_link_and_leaves_the_folder_it_points_to_alone(four_steps, tmp_path, cli):
    run = crashed_at_step_3(four_steps, tmp_path / "run")
    mine = tmp_path / "my-checkpoints"
    shutil.move(run / "checkpoints", mine)  # the run's checkpoints, and a folder of the user's beside them
    (mine / "step-000000001-mine").mkdir()
    (mine / "step-000000001-mine" / "notes.txt").write_text("mine")
    (run / "checkpoints").symlink_to(mine)
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))

    result = cli("run", "--resume", str(run), "--quiet")

    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "symbolic link" in result.stderr, result.stderr
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == before
    assert (mine / "step-000000001-mine" / "notes.txt").read_text() == "mine"


def test_pruning_keeps_the_user_s_step_folders_and_names_a_file_that_looks_like_a_checkpoint(four_steps, tmp_path,
                                                                                             cli):
    run = crashed_at_step_3(four_steps, tmp_path / "run")
    notes = run / "checkpoints" / "step-000000001-notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    stray = run / "checkpoints" / "step-000000002"  # a checkpoint's exact name, but a file (and pruned by now)
    stray.write_text("mine")

    result = cli("run", "--resume", str(run), "--quiet")

    assert result.exit_code == 0, result.output
    assert (notes / "todo.txt").read_text() == "mine" and stray.read_text() == "mine"
    warned = [line for line in result.stderr.splitlines() if str(stray) in line]
    assert warned == [f"warning: {stray} is not a checkpoint taskformer wrote; it was left alone"], result.stderr
    ours = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-0000000"))
    assert ours == ["step-000000001-notes", "step-000000002", "step-000000003", "step-000000004"]
    assert json.loads((run / "result.json").read_text())["info"]["steps"] == 4


def test_a_checkpoint_folder_of_the_user_s_with_a_checkpoint_s_name_is_not_loaded(four_steps, tmp_path, cli):
    run = crashed_at_step_3(four_steps, tmp_path / "run")
    fake = run / "checkpoints" / "step-000000009"  # newer than any checkpoint, but not one taskformer wrote
    fake.mkdir()
    (fake / "state.json").write_text("{}")

    result = cli("run", "--resume", str(run), "--quiet")

    assert result.exit_code == 0, result.output  # resumed from step 3, not from the user's folder
    assert json.loads((run / "result.json").read_text())["info"]["steps"] == 4
    assert (fake / "state.json").read_text() == "{}"


def test_a_state_with_an_elapsed_time_that_is_not_a_number_is_refused_in_one_line(four_steps, tmp_path, cli):
    run = crashed_at_step_3(four_steps, tmp_path / "run")
    state = run / "checkpoints" / "step-000000003" / "state.json"
    state.write_text(state.read_text().replace('"elapsed": ', '"elapsed": NaN, "was": '))

    result = cli("run", "--resume", str(run), "--quiet")

    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error:") and len(result.stderr.strip().splitlines()) == 1
    assert "elapsed must be a non-negative number" in result.stderr
