"""docs/plugins.md and docs/config.md cannot drift: their references are generated, the tutorial is the example plugin."""
import inspect
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import torch

from taskformer import EOS, Constraint, DecodeConfig, ModelConfig, search, symbols
from taskformer.app import scaffold
from taskformer.core.model import Transformer
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
PAIRS = "## Sentence pairs"
DECODER_ONLY = "## Language models: the decoder-only variant"


def code_lines(text):
    return [line for line in text.splitlines() if line.strip()]


def python_blocks(text):
    return "\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))


def test_tutorial_code_is_the_example_plugin():
    tutorial = DOC.split(MARKER)[0].split(ENCODER_ONLY)[0]
    example = (ROOT / "examples" / "taskformer-reverse" / "taskformer_reverse.py").read_text(encoding="utf-8")
    assert code_lines(python_blocks(tutorial)) == code_lines(example)


def test_encoder_only_tutorial_code_is_the_tagging_scaffold(tmp_path):
    section = ENCODER_ONLY + DOC.split(MARKER)[0].split(ENCODER_ONLY)[1].split(PAIRS)[0]
    written = scaffold.write("repeats", tmp_path / "pkg", "tagging")
    module = next(p for p in written if p.name == "taskformer_repeats.py").read_text(encoding="utf-8")
    assert code_lines(python_blocks(section)) == code_lines(module)


def test_sentence_pairs_section_code_is_the_pairs_scaffold(tmp_path):
    """The scaffold's own test runs this module (tests/test_scaffold.py), and tests/test_pairs.py trains it."""
    section = DOC.split(MARKER)[0].split(PAIRS)[1].split(DECODER_ONLY)[0]
    written = scaffold.write("entails", tmp_path / "pkg", "encoder-only", pairs=True)
    module = next(p for p in written if p.name == "taskformer_entails.py").read_text(encoding="utf-8")
    assert code_lines(python_blocks(section)) == code_lines(module)


def test_language_model_section_code_is_the_decoder_only_scaffold(tmp_path):
    section = DOC.split(MARKER)[0].split(DECODER_ONLY)[1]
    written = scaffold.write("counting", tmp_path / "pkg", "decoder-only")
    module = next(p for p in written if p.name == "taskformer_counting.py").read_text(encoding="utf-8")
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


def test_the_constraint_example_restricts_outputs_to_its_alphabet():
    """The example in Constraint's docstring (docs/plugins.md's decoding reference) runs as written."""
    example = inspect.getdoc(Constraint).split("::\n", 1)[1]
    namespace = {}
    exec(compile(textwrap.dedent(example), "Constraint example", "exec"), namespace)
    tokenizer = symbols(list("abcdefghijklmnopqrstuvwxyz"))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_heads=2, enc_layers=1,
                                    dec_layers=1, d_ff=32, dropout=0.0)).eval()
    src = torch.tensor([tokenizer.encode("h e l l o").ids + [EOS], tokenizer.encode("w x y z q").ids + [EOS]])
    for strategy in ("greedy", "beam"):
        config = SimpleNamespace(decode=DecodeConfig(strategy=strategy, beam=3, max_len_a=2.0, max_len_b=4))
        outputs = namespace["taskformer_decode"](model, src, tokenizer, config)
        assert len(outputs) == 2 and all(o and set(o.split()) <= set("aeiou") for o in outputs), outputs
        vowels = {tokenizer.token_to_id(v) for v in "aeiou"}
        unconstrained = search(model, src, config.decode)  # this untrained model picks other tokens
        assert any(set(ids) - vowels for ids in unconstrained), unconstrained


def test_the_testing_section_shows_the_example_plugins_test():
    shown = DOC.split("## 11. Test it")[1].split("```\n")[1]
    assert shown == (ROOT / "examples" / "taskformer-reverse" / "tests" / "test_taskformer_reverse.py").read_text()


def test_the_reference_gives_the_signature_of_every_public_helper_the_tutorial_names():
    for name in ("read_lines", "read_parallel", "read_tsv", "find_file", "option", "TaskData", "Run", "track", "stage",
                 "translation_metrics", "span_scores", "cross_attention", "save_figure", "greedy", "search", "sample",
                 "beam_search"):
        assert f"#### `{name}(" in DOC.split(MARKER)[1], name
    assert "#### `read_tsv(path: str | Path, columns: int = 2) -> list[tuple[str, ...]]`" in DOC
    assert "#### `option(default: Any, help: str, *, at_least: float | None = None, " in DOC  # keyword-only marked


PACKAGE = ["core", "plugins", "tasks", "taskformer"]


def test_the_architecture_names_every_module():
    """docs/architecture.md says what each module is for: a new module is named there too."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = [path for folder in PACKAGE for path in (ROOT / folder).rglob("*.py")
               if path.name != "__init__.py" and "scaffold" not in path.parts]
    missing = [str(path.relative_to(ROOT)) for path in modules
               if f"`{path.name}`" not in text and f"`{path.stem}`" not in text and f"/{path.name}`" not in text]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def linked_files(text: str, base: Path) -> list[tuple[str, Path]]:
    """The files that a markdown text's relative links name (anchors dropped), as paths from ``base``."""
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [(link, base / link.split("#")[0]) for link in links
            if not re.match(r"[a-z]+:", link) and not link.startswith("#")]


def test_every_relative_link_in_the_docs_names_a_file_that_exists():
    broken = [f"{page.relative_to(ROOT)}: {link}" for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
              for link, target in linked_files(page.read_text(encoding="utf-8"), page.parent) if not target.exists()]
    assert not broken, broken


def test_every_bench_script_the_docs_and_code_name_exists():
    """A moved or renamed bench script is named by its new path everywhere but the archive, whose commands are
    kept as they were run."""
    named = re.compile(r"(?<![\w/.])bench/[a-z0-9_/]+\.(?:py|sh)")  # a real path, not bench/KIND/SCRIPT.py
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / ".ci").rglob("*"),
             *(path for folder in [*PACKAGE, "tests", "bench"] for path in (ROOT / folder).rglob("*.py"))]
    missing = sorted({f"{page.relative_to(ROOT)}: {path}" for page in pages if page.is_file()
                      for path in named.findall(page.read_text(encoding="utf-8")) if not (ROOT / path).exists()})
    assert not missing, missing
