"""The code passes ruff (pyflakes, pycodestyle, import order, bugbear, pyupgrade; configured in
pyproject.toml) with no finding, so the suite that CI runs also holds the lint."""
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_package():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is part of the test extra: pip install -e '.[test]'"
    found = subprocess.run([ruff, "check", "--no-cache", "core", "plugins", "tasks", "taskformer"], cwd=ROOT,
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr
