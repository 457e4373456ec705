"""Run directories in the formats core/compat.py lists still load (the other two: test_agnews, test_binding)."""
import json

from conftest import TINY


def test_a_checkpoint_from_before_the_cooldown_resumes(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "copy", "--out", str(out), *TINY, "--set", "train.save_every=1").exit_code == 0
    (out / "result.json").unlink()  # an unfinished run, as a crash leaves it
    state = sorted((out / "checkpoints").glob("step-*"))[-1] / "state.json"
    saved = json.loads(state.read_text())
    del saved["cooldown"]
    state.write_text(json.dumps(saved))
    resumed = cli("run", "--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "result.json").read_text())["info"]["steps"] == 2
