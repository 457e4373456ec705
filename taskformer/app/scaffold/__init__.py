"""``taskformer new-task``: write a complete, installable task plugin package from templates.

One package per model variant, each a small synthetic task that trains in seconds: reverse digits
(encoder-decoder), low or high digits (encoder-only: a classifier), digits seen once or repeated (tagging),
counting on from a prompt (decoder-only: a language model); with ``--pairs``, whether the digits of one
text are in another (encoder-only, a classifier of pairs of texts).
``pyproject.toml`` and the README are shared; the module and its test are the variant's own.
The encoder-decoder package for ``reverse`` is ``examples/taskformer-reverse`` (a test keeps them
equal), so the scaffold, the example and the tutorial in docs/plugins.md are one piece of code.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from importlib.resources import files
from pathlib import Path
from string import Template

from taskformer.core import variants
from taskformer.core.errors import TaskformerError

VARIANTS = {  # variant: (what the package's task is, for its README; an input to try with predict)
    "encoder-decoder": ("the model learns to reverse a sequence of digits", "1 2 3 4 5 6"),
    "encoder-only": ("the model learns whether most digits of a sequence are low (0-4) or high (5-9)",
                       "1 2 3 7 8 9 9"),
    "tagging": ("the model learns to tag each digit of a sequence `once` or `repeated`", "1 2 1 3 4 3"),
    "decoder-only": ("a language model learns to count on from a prompt of digits in its steps (`1 3 5` goes on "
                     "`7 9 1 3 5 7`)", "1 3 5"),
}
PAIRS = ("the model learns whether each digit of a short sequence is in a longer one, given the two as a pair "
         "of texts", r"3 1 4 1 5 9 2\t9 1")  # an encoder-only package with --pairs; printf's \t is the TAB
FILES = {"pyproject.toml.tmpl": "pyproject.toml", "README.md.tmpl": "README.md",
         "${template}.py.tmpl": "${module}.py", "test_${template}.py.tmpl": "tests/test_${module}.py"}


MAX_NAME = 64  # characters of a task name: its files' names must fit the file system's 255 bytes


def names(task: str) -> dict[str, str]:
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", task):
        raise TaskformerError(f"task name {task!r}: use lower-case letters, digits and single hyphens, e.g. sort-digits")
    if len(task) > MAX_NAME:
        raise TaskformerError(f"task name {task[:20]}...: at most {MAX_NAME} characters, got {len(task)}")
    module = "taskformer_" + task.replace("-", "_")
    return {"task": task, "module": module, "package": "taskformer-" + task}


def write(task: str, target: Path, variant: str = "encoder-decoder", pairs: bool = False) -> list[Path]:
    """Render the templates into ``target`` (which must not exist or be empty); returns the files written.
    ``pairs``: an encoder-only task whose inputs are pairs of texts.

    The package is written into a temporary folder beside ``target`` and renamed into place, so a
    failure leaves no half-written package."""
    if variant not in VARIANTS:
        raise TaskformerError(f"unknown variant {variant!r}: choose {', '.join(VARIANTS)}")
    if pairs and not variants.of(variant).classifies:
        raise TaskformerError(f"--pairs is for encoder-only tasks (a class per pair of texts), not {variant}")
    about, example = PAIRS if pairs else VARIANTS[variant]
    command = (f"taskformer new-task {task}" + ("" if variant == "encoder-decoder" else f" --variant {variant}")
               + (" --pairs" if pairs else ""))
    # how the README tries the model: a pair of texts is one line with a TAB between them
    predict = (f"printf '{example}\\n' | taskformer predict runs/{task}" if pairs
               else f'taskformer predict runs/{task} "{example}"')
    values = {**names(task), "template": variant + ("-pairs" if pairs else ""),
              "about": about, "predict": predict, "command": command}
    try:
        if target.exists() and any(target.iterdir()):
            raise TaskformerError(f"{target} already exists and is not empty")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.new-"))
    except OSError as e:  # /proc, a read-only disk, a denied folder
        raise TaskformerError(f"{target}: cannot write a package there ({e.strerror or e})") from None
    try:
        for template, name in FILES.items():
            path = staging / Template(name).substitute(values)
            path.parent.mkdir(parents=True, exist_ok=True)
            source = files(__package__).joinpath(Template(template).substitute(values)).read_text(encoding="utf-8")
            path.write_text(Template(source).substitute(values), encoding="utf-8")
        staging.chmod(0o777 & ~umask())  # mkdtemp's folder is private; the package is not
        os.replace(staging, target)  # an empty target folder is replaced
    except OSError as e:
        raise TaskformerError(f"{target}: cannot write a package there ({e.strerror or e})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [target / Template(name).substitute(values) for name in FILES.values()]


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
