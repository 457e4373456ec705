"""Reports a person can read: the HTML with its plots in a real browser, run history, re-rendering."""
import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import TINY, run_cli, run_here

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = root / "copy" / "first"
    result = run_here("run", "copy", "--out", str(out), "--set", "data.train_size=2000", "--set", "train.epochs=2",
                      "--set", "train.log_every=5", "--quiet")
    assert result.returncode == 0, result.stderr
    return root, out


def test_report_html_is_self_contained_with_the_training_plot(finished_run):
    _, out = finished_run
    page = (out / "report.html").read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert "training" in images
    assert "exact_match" in page and "Test samples" in page
    assert "src=\"http" not in page and "src='http" not in page  # nothing fetched from elsewhere


def in_chromium(report, probe: str, tmp_path):
    """What ``probe``, a script that sets the page's title to JSON once it has loaded, finds in
    ``report`` as headless Chromium lays it out (Debian's package; skipped where it is missing)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    page = tmp_path / "report.html"
    page.write_text(report.read_text().replace("</body>", probe + "</body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    title = re.search(r"<title>(.*?)</title>", dom, flags=re.S)
    assert title, dom
    return json.loads(title.group(1).replace("&quot;", '"'))


def test_report_html_plots_render_as_visible_images_in_chromium(finished_run, tmp_path):
    _, out = finished_run
    probe = ("<script>window.addEventListener('load', () => { document.title = JSON.stringify("
             "[...document.images].map(i => [i.alt, i.naturalWidth, Math.round(i.getBoundingClientRect().width)]));"
             "});</script>")
    images = in_chromium(out / "report.html", probe, tmp_path)
    assert any(alt == "training" for alt, _, _ in images)
    for alt, natural_width, shown_width in images:
        assert natural_width > 100 and shown_width > 100, (alt, natural_width, shown_width)


def test_runs_lists_finished_runs_with_their_main_metric(finished_run):
    root, out = finished_run
    result = run_here("runs", str(root))
    assert result.returncode == 0
    assert "copy" in result.stdout and "exact_match" in result.stdout and out.name in result.stdout


def test_report_command_rerenders_console_and_html(finished_run):
    _, out = finished_run
    (out / "report.html").unlink()
    result = run_here("report", str(out))
    assert result.returncode == 0, result.stderr
    assert "taskformer report" in result.stdout and "exact_match" in result.stdout
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_progress_falls_back_to_plain_lines_without_a_terminal(tmp_path):
    result = run_cli("run", "copy", "--out", str(tmp_path / "r"), "--set", "data.train_size=500",
                     "--set", "train.epochs=1", "--set", "train.log_every=5")
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert "loading data and training the tokenizer ..." in lines
    assert any(line.startswith("step 5 epoch 1/1 loss") for line in lines)
    assert "decoding test ..." in lines and any(line.startswith("decoding test: done in") for line in lines)
    assert "\x1b[" not in result.stderr  # no terminal control codes in a log


TINY_TRANSLATE = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1", "model.d_ff=64",
                  "train.epochs=1", "train.warmup=10", "train.bf16=false", "data.vocab_size=200"]


def test_terminal_gets_rich_bars_for_data_tokenizer_training_and_decoding(tmp_path, data_dir, cache):
    """An empty cache of its own: the data is read and the tokenizer trained here, whatever ran before."""
    sets = [x for o in TINY_TRANSLATE for x in ("--set", o)]
    result = run_cli("run", "translate-de-en", "--data-dir", str(data_dir / "multi30k"), "--out", str(tmp_path / "r"),
                     *sets, "--set", "train.log_every=1", env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"})
    assert result.returncode == 0, result.stderr
    assert "\x1b[" in result.stderr and "━" in result.stderr  # drawn as live bars, not log lines
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stderr)
    for finished in ("reading train.de.gz", "reading train.en", "training the tokenizer", "decoding val", "decoding test"):
        assert re.search(re.escape(finished) + r": done in [0-9.]+ s", err), finished
    assert re.search(r"training, epoch 1/1 .* step \d+ +[0-9,]+ tok/s +\d+ s used", err)  # from the first update


def test_plugins_report_their_own_stages_through_core_progress():
    from taskformer.core import progress

    events = []
    with progress.listening(events.append):
        assert list(progress.track(range(5), "counting", total=5, every=2)) == [0, 1, 2, 3, 4]
        with progress.stage("unsized") as advance:
            advance()
    assert events[0] == {"event": "stage", "name": "counting", "total": 5}
    assert [e["n"] for e in events if e["event"] == "advance"] == [2, 2, 1, 1]
    assert [e["name"] for e in events if e["event"] == "stage-done"] == ["counting", "unsized"]
    assert list(progress.track("ab", "nobody listens")) == ["a", "b"]  # no listener: plain iteration


@pytest.fixture
def own_run(tmp_path_factory, tmp_path):
    """A finished tiny run with a training plot, copied for one test to change."""
    made = tmp_path_factory.getbasetemp() / "report-own-run"
    if not made.exists():
        result = run_here("run", "copy", "--out", str(made), *TINY, "--set", "train.log_every=1")
        assert result.returncode == 0, result.stderr
    return Path(shutil.copytree(made, tmp_path / "run", symlinks=True))


PNG = b"\x89PNG\r\n\x1a\n"


def test_report_writes_no_file_through_a_link_and_embeds_only_the_plots_it_wrote(own_run, tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_bytes(PNG + b"-----BEGIN OPENSSH PRIVATE KEY-----")  # even one that looks like a PNG
    (own_run / "leak.png").symlink_to(secret)
    (own_run / "old.png").write_bytes(PNG + b"a file the report did not write")
    victims = {}
    for name in ("training.png", "report.txt", "report.html"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_bytes(b"mine")
        (own_run / name).unlink(missing_ok=True)
        (own_run / name).symlink_to(victims[name])
    result = run_here("report", str(own_run))
    assert result.returncode == 0, result.stderr
    assert all(v.read_bytes() == b"mine" for v in victims.values())  # each link was replaced, not written through
    assert not any((own_run / name).is_symlink() for name in victims)
    assert (own_run / "training.png").read_bytes().startswith(PNG)
    page = (own_run / "report.html").read_text()
    assert re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page) == ["training"]
    assert base64.b64encode(secret.read_bytes()).decode()[:40] not in page


HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m [/] [bold]x \u202egnp."


def test_text_from_data_is_shown_with_its_control_characters_visible_and_never_read_as_markup(own_run):
    path = own_run / "outputs-test.jsonl"
    # a short output, whatever the tiny model wrote, so that no column wraps the hostile text in report.txt's width
    rows = [{**json.loads(line), "source": HOSTILE, "output": "1", "reference": HOSTILE}
            for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_here("report", str(own_run))
    assert result.returncode == 0, result.stderr
    for shown in (result.stdout, (own_run / "report.txt").read_text(), (own_run / "report.html").read_text()):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", shown)  # no control character left
        assert "\\x1b]0;pwned\\x07" in shown and "[/] [bold]x" in shown and "\\u202egnp." in shown


def test_report_html_has_real_tables_not_the_consoles_box_drawing(finished_run):
    _, out = finished_run
    page = (out / "report.html").read_text()
    assert not re.search("[\u2500-\u257f]", page)  # no box-drawing character: the tables are HTML
    assert "<th>source</th><th>output</th><th>reference</th>" in page
    source = json.loads((out / "outputs-test.jsonl").read_text().splitlines()[0])["source"]
    assert f"<td>{source}</td>" in page


# The left edge of every cell of the test samples' table, column by column, as Chromium lays it out.
COLUMN_EDGES = ("<script>window.addEventListener('load', () => { const t = [...document.querySelectorAll('table')]"
                ".find(t => t.textContent.includes('reference')); document.title = JSON.stringify([...t.rows]"
                ".map(r => [...r.cells].map(c => Math.round(c.getBoundingClientRect().left)))); });</script>")


def test_report_html_columns_line_up_with_chinese_text(own_run, tmp_path):
    """The console's tables count a Chinese character as two cells, which a browser's monospace font
    does not: in report.html each column starts at one edge, whatever the script of its text."""
    path = own_run / "outputs-test.jsonl"
    lines = ["春风送暖入屠苏", "海阔凭鱼跃，天高任鸟飞", "1 2", "一帆风顺年年好，万事如意步步高"]
    rows = [{**json.loads(line), "source": lines[i % 4], "reference": lines[(i + 1) % 4]}
            for i, line in enumerate(path.read_text().splitlines())]
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    assert run_here("report", str(own_run)).returncode == 0
    edges = in_chromium(own_run / "report.html", COLUMN_EDGES, tmp_path)
    assert len(edges) > 2 and all(len(row) == 3 for row in edges)
    assert [len({row[c] for row in edges}) for c in range(3)] == [1, 1, 1], edges


def test_a_run_too_short_for_a_curve_gets_no_empty_plot(tmp_path):
    out = tmp_path / "r"
    result = run_here("run", "copy", "--out", str(out), *TINY, "--set", "train.max_steps=1", "--set", "train.log_every=1")
    assert result.returncode == 0, result.stderr
    assert not (out / "training.png").exists()  # one update: one point of loss, one of learning rate
    assert 'alt="training"' not in (out / "report.html").read_text()
