"""docs/plugins.md cannot drift: its hook reference is generated, its tutorial is the example plugin."""
import re
from pathlib import Path

from taskformer.core.tokenize import check_specials
from taskformer.plugins.docs import MARKER, hook_reference

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")


def test_hook_reference_matches_the_hook_docstrings():
    assert DOC.split(MARKER)[1] == hook_reference().split(MARKER)[1], \
        "regenerate with: python -m taskformer.plugins.docs docs/plugins.md"
    for hook in ("taskformer_tasks", "taskformer_data", "taskformer_head", "taskformer_normalize", "taskformer_decode",
                 "taskformer_metrics", "taskformer_report_sections", "taskformer_register_commands"):
        assert f"### `{hook}(" in DOC


def test_tutorial_code_is_the_example_plugin():
    tutorial = DOC.split(MARKER)[0]
    blocks = re.findall(r"```python\n(.*?)```", tutorial, flags=re.S)
    example = (ROOT / "examples" / "taskformer-reverse" / "taskformer_reverse.py").read_text(encoding="utf-8")

    def code_lines(text):
        return [line for line in text.splitlines() if line.strip()]

    assert code_lines("\n".join(blocks)) == code_lines(example)


def test_the_tokenizer_snippet_runs_and_keeps_the_special_ids():
    snippets = re.findall(r"```py\n(.*?)```", DOC.split(MARKER)[0], flags=re.S)
    assert len(snippets) == 1
    namespace = {}
    exec(compile(snippets[0], "docs/plugins.md", "exec"), namespace)
    check_specials(namespace["tokenizer"])
