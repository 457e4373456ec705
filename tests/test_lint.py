"""The code passes ruff (pyflakes, pycodestyle, import order, bugbear, pyupgrade) and mypy, both configured
in pyproject.toml, with no finding, so the suite that CI runs also holds the lint and the types."""
import importlib.util
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # lints the package: the full run's, not the quick tier's

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_package():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is part of the test extra: pip install -e '.[test]'"
    found = subprocess.run([ruff, "check", "--no-cache", "core", "plugins", "tasks", "taskformer"], cwd=ROOT,
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


def installed_layout(into: Path) -> Path:
    """The package laid out under ``into`` as it installs, ``taskformer/core`` for ``core/`` and so on, in
    links to the source folders that pyproject.toml's package-dir maps: mypy finds a package by its
    folders and cannot follow the import hook of setuptools' editable install."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = into / "taskformer"
    top.mkdir(parents=True)
    for entry in (ROOT / folders["taskformer"]).iterdir():
        (top / entry.name).symlink_to(entry)
    for package, folder in folders.items():
        place = into.joinpath(*package.split("."))
        if not place.exists():  # taskformer.plugins.builtin is inside plugins/ already
            place.symlink_to(ROOT / folder, target_is_directory=True)
    return into


def test_mypy_finds_nothing_in_the_package(tmp_path):
    assert importlib.util.find_spec("mypy"), "mypy is part of the test extra: pip install -e '.[test]'"
    tree = installed_layout(tmp_path / "tree")
    found = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                            "--cache-dir", str(tmp_path / "cache"), "-p", "taskformer"], cwd=tree,
                           capture_output=True, text=True)
    assert found.returncode == 0, ("paths as installed (taskformer/core/ is core/):\n" + found.stdout + found.stderr)
