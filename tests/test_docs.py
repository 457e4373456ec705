"""docs/plugins.md and docs/config.md cannot drift: their references are generated, the tutorial is the example plugin."""
import re
from pathlib import Path

from taskformer.app import scaffold
from taskformer.core.tokenize import check_specials
from taskformer.plugins.docs import MARKER, config_reference, hook_reference

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")


def test_hook_reference_matches_the_hook_docstrings():
    assert DOC.split(MARKER)[1] == hook_reference().split(MARKER)[1], \
        "regenerate with: python -m taskformer.plugins.docs docs/plugins.md"
    for hook in ("taskformer_tasks", "taskformer_data", "taskformer_head", "taskformer_normalize", "taskformer_decode",
                 "taskformer_metrics", "taskformer_report_sections", "taskformer_register_commands"):
        assert f"### `{hook}(" in DOC


ENCODER_ONLY = "## Encoder-only tasks"


def code_lines(text):
    return [line for line in text.splitlines() if line.strip()]


def python_blocks(text):
    return "\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))


def test_tutorial_code_is_the_example_plugin():
    tutorial = DOC.split(MARKER)[0].split(ENCODER_ONLY)[0]
    example = (ROOT / "examples" / "taskformer-reverse" / "taskformer_reverse.py").read_text(encoding="utf-8")
    assert code_lines(python_blocks(tutorial)) == code_lines(example)


def test_encoder_only_tutorial_code_is_the_tagging_scaffold(tmp_path):
    section = ENCODER_ONLY + DOC.split(MARKER)[0].split(ENCODER_ONLY)[1]
    written = scaffold.write("repeats", tmp_path / "pkg", "tagging")
    module = next(p for p in written if p.name == "taskformer_repeats.py").read_text(encoding="utf-8")
    assert code_lines(python_blocks(section)) == code_lines(module)


def test_the_tokenizer_snippet_runs_and_keeps_the_special_ids():
    snippets = re.findall(r"```py\n(.*?)```", DOC.split(MARKER)[0], flags=re.S)
    assert len(snippets) == 1
    namespace = {}
    exec(compile(snippets[0], "docs/plugins.md", "exec"), namespace)
    check_specials(namespace["tokenizer"])


def test_config_reference_matches_the_field_metadata():
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == config_reference(), \
        "regenerate with: python -m taskformer.plugins.docs docs/config.md"
    for key in ("model.d_model", "train.max_steps", "decode.beam", "data.vocab_size", "decode.tone_penalty"):
        assert f"- `{key}` (" in config_reference()
