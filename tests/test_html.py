"""report.html and index.html: one self-contained page each, checked as text and in a real browser.

The browser tests run Debian's chromium headless (`.ci/run` installs it)
and read the DOM it built; they skip only where no chromium is installed.
"""

import html
import io
import json
import re
import shutil
import subprocess

import graph_models as gm
import pytest
from click.testing import CliRunner
from conftest import SAMPLES, invoke

from mpconvert.cli import cli
from mpconvert.render.html import report_page
from mpconvert.report.report import Report

CANCER = SAMPLES / "cancer_mlp.keras"
CANCER_DATA = SAMPLES / "data" / "breast_cancer.npz"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REMOTE = re.compile(r"""(https?:)|((src|href)\s*=\s*["']?//)|(@import)|(url\()""", re.IGNORECASE)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """cancer_mlp with fine-tuning, padding and speed: every section of the page has data."""
    out = tmp_path_factory.mktemp("html") / "cancer"
    result = invoke(
        CANCER, "--policy", "mixed_float16", "--data", CANCER_DATA, "--out", out,
        "--finetune-steps", "20", "--pad-multiple", "8", "--speed",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "report.json").read_text()), result


def text_of(page: str) -> str:
    """The page's text as a reader sees it: tags out, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_every_conversion_writes_its_page_with_verdict_checks_layers_and_charts(converted):
    out, report, result = converted
    page = (out / "report.html").read_text()
    assert f"page: {out / 'report.html'}" in " ".join(result.output.split())
    text = text_of(page)
    assert "PASSED: every gate check holds" in text
    for check in report["gate"]["checks"]:
        assert check["name"] in text and check["message"] in text
    for layer in report["layers"]:
        assert f"<code>{layer['name']}</code>" in page
    # Charts: the metric against its budget, speed per path, the fine-tune loss, the stages' seconds.
    titles = re.findall(r"<svg[^>]*aria-label=\"([^\"]+)\"", page)
    assert any(t.startswith("accuracy before and after (budget 0.01)") for t in titles)
    assert "speed against float32 (above 1 is faster)" in titles and "fine-tune loss over the steps" in titles
    assert len(re.findall(r"<polyline", page)) >= 1 and "padded 30 → 32" in text
    for artifact in report["artifacts"]:
        assert artifact["path"] in text
    assert f"tensorflow {report['versions']['tensorflow']}" in text
    # The fine-tune history behind the loss chart: every step, the last one included.
    history = report["finetune"]["history"]
    assert history["step"] == list(range(1, 21)) and len(history["loss"]) == 20
    assert history["loss"][0] == pytest.approx(report["finetune"]["loss"]["first"])


def test_pages_name_no_address_and_escape_what_the_model_names(converted):
    out, report, _ = converted
    page = (out / "report.html").read_text()
    assert not REMOTE.search(page), REMOTE.search(page)
    assert page.count("<script") == 0  # the report page needs no script at all
    hostile = json.loads(json.dumps(report))
    hostile["layers"][1]["name"] = "<script>alert(1)</script>"
    hostile["source"]["path"] = "/models/<img src=x onerror=alert(1)>.keras"
    rendered = report_page(Report.from_json(hostile))
    assert "<script>alert(1)</script>" not in rendered and "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert "<img src=x" not in rendered


def svg_of(page: str, title: str) -> tuple[list[tuple[float, str]], list[tuple[float, float]]]:
    """A chart's text labels as (x, text) and its polyline's points, from the page's SVG."""
    svg = re.search(rf'<svg[^>]*aria-label="{re.escape(title)}"(.*?)</svg>', page, re.S)
    assert svg is not None, f"no chart {title!r}"
    texts = [(float(x), t) for x, t in re.findall(r'<text x="([-\d.]+)"[^>]*>([^<]*)</text>', svg.group(1))]
    (points,) = re.findall(r'<polyline[^>]*points="([^"]+)"', svg.group(1))
    return texts, [tuple(map(float, p.split(","))) for p in points.split()]


def test_the_fine_tune_charts_number_their_steps_and_show_the_loss_scale(converted):
    out, report, _ = converted
    page = (out / "report.html").read_text()
    history = report["finetune"]["history"]  # 20 steps, each recorded
    for title in ("fine-tune loss over the steps", "loss scale over the steps (log)"):
        texts, points = svg_of(page, title)
        ticks = [(x, t) for x, t in texts if t.isdigit() and x >= 70]  # the x axis: y labels end left of it
        assert [t for _, t in ticks] == ["1", "5", "10", "15", "20"] and ("step" in [t for _, t in texts])
        # Each number sits at its step (x linear in the step) and well inside the 640-unit chart:
        # "step 100" centred at 630 used to be cut to "step 1".
        (x1, _), (x20, _) = ticks[0], ticks[-1]
        assert x20 <= 640 - 40
        for x, t in ticks:
            assert x == pytest.approx(x1 + (x20 - x1) * (int(t) - 1) / 19, abs=0.1)
        # Every recorded step is a corner of the line.
        assert {round(x, 1) for x, _ in points} == {round(x1 + (x20 - x1) * (s - 1) / 19, 1) for s in history["step"]}
    texts, points = svg_of(page, "loss scale over the steps (log)")
    scales = sorted(set(history["loss_scale"]))
    assert [t for x, t in texts if x < 70 and t != "step"] == [f"{s:g}" for s in scales]
    assert all(10 <= y < 156 for _, y in points)  # drawn above the x axis (y 156), not hidden under it


def test_a_loss_scale_that_halves_is_drawn_as_held_steps_at_its_recorded_values():
    from mpconvert.render.html import line_chart

    chart = line_chart("scale", [1, 2, 3, 4], [32768.0, 32768.0, 16384.0, 16384.0], "scale", log=True, held=True)
    labels = {t["text"]: t for t in chart.labels}
    assert {"32768", "16384", "1", "2", "3", "4", "step"} == set(labels)
    (path,) = chart.paths
    corners = [tuple(map(float, p.split(","))) for p in path["points"].split()]
    high, low = labels["32768"]["y"] - 4, labels["16384"]["y"] - 4
    # Held at 32768 to step 3, where it was recorded halved, then held at 16384.
    xs = [labels[str(s)]["x"] for s in (1, 2, 3, 4)]
    assert corners == [(xs[0], high), (xs[1], high), (xs[2], high), (xs[2], low), (xs[3], low)]
    assert low < 156  # above the x axis, not hidden under it


def test_check_html_writes_the_page_of_a_recheck(converted, tmp_path):
    out, _, _ = converted
    page = tmp_path / "recheck.html"
    result = invoke("check", out / "report.json", "--min-speedup", "100", "--html", page)
    assert result.exit_code == 3, result.output
    text = text_of(page.read_text())
    assert "FAILED: speed" in text.split("Gate checks")[0]


def test_a_graph_level_report_renders_without_the_sections_it_lacks(tmp_path):
    out = tmp_path / "graph"
    result = invoke(gm.two_matmuls(tmp_path / "mlp"), "--policy", "mixed_bfloat16", "--out", out)
    assert result.exit_code == 0, result.output
    text = text_of((out / "report.html").read_text())
    assert "graph-level: no Keras layers" in text and "StatefulPartitionedCall/MatMul" in text
    assert "Fine-tuning not run" in text and "Padding not run" in text
    assert re.search(r"Nodes \(\d+ in mixed_bfloat16, \d+ kept float32\)", text)


@pytest.fixture(scope="module")
def batch_root(tmp_path_factory):
    """A batch of a converted model and a broken file: one row links, the other cannot."""
    base = tmp_path_factory.mktemp("batch_html")
    zoo = base / "zoo"
    zoo.mkdir()
    (zoo / "cancer.keras").write_bytes(CANCER.read_bytes())
    (zoo / "cancer.npz").write_bytes(CANCER_DATA.read_bytes())
    (zoo / "broken.keras").write_bytes(b"not a zip file")
    out = base / "out"
    args = ["batch", str(zoo), "--policy", "mixed_bfloat16", "--out", str(out), "--export", "savedmodel"]
    # The index links pages and shows the drop; no timing or padding is read from this batch.
    quick = ["--finetune-steps", "0", "--no-speed", "--pad-multiple", "0", "--jobs", "1"]
    result = CliRunner().invoke(cli, [*args, *quick])
    assert result.exit_code == 1, result.output  # the broken file is an error
    return out, json.loads((out / "batch.json").read_text())


def test_a_batch_root_gets_an_index_linking_every_converted_model(batch_root):
    out, summary = batch_root
    page = (out / "index.html").read_text()
    assert not REMOTE.search(page)
    links = re.findall(r'<a href="([^"]+)">', page)
    converted = [m for m in summary["models"] if m["status"] in ("passed", "gate_failed")]
    assert len(links) == len(converted) == 1 and all((out / link).is_file() for link in links)
    text = text_of(page)
    for m in summary["models"]:
        assert m["name"] in text and m["status"] in text
    assert "FAILED:" in text and "0.0000 / 0.0100" in text  # cancer's drop against its budget


def test_batch_merge_of_separate_shards_gets_one_page(tmp_path):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for name in ("a", "b"):
        (zoo / f"{name}.keras").write_bytes(CANCER.read_bytes())
        (zoo / f"{name}.npz").write_bytes(CANCER_DATA.read_bytes())
    common = ["--policy", "mixed_bfloat16", "--export", "savedmodel", "--finetune-steps", "0", "--jobs", "1"]
    common += ["--no-speed", "--pad-multiple", "0"]  # only the links are read
    for i in (1, 2):
        result = CliRunner().invoke(
            cli, ["batch", str(zoo), "--out", str(tmp_path / f"s{i}"), "--shard", f"{i}/2", *common]
        )
        assert result.exit_code == 0, result.output
    merged = tmp_path / "merged"
    result = CliRunner().invoke(cli, ["batch-merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(merged)])
    assert result.exit_code == 0, result.output
    links = re.findall(r'<a href="([^"]+)">', (merged / "index.html").read_text())
    # ../s1/NAME/mixed_bfloat16/report.html: each shard's own root, relative to the merged page.
    assert sorted(link.split("/")[2] for link in links) == ["a", "b"]
    assert {link.split("/")[1] for link in links} == {"s1", "s2"}
    assert all((merged / link).resolve().is_file() for link in links)


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (.ci/run installs Debian's)")
def test_a_browser_shows_the_report_and_the_batch_page(converted, batch_root, tmp_path):
    out, report, _ = converted
    dom = chromium("--dump-dom", (out / "report.html").as_uri())
    assert dom.returncode == 0, dom.stderr
    text = text_of(dom.stdout)
    assert "PASSED: every gate check holds" in text
    assert all(check["name"] in text for check in report["gate"]["checks"])
    assert all(layer["name"] in text for layer in report["layers"])
    assert dom.stdout.count("<svg") >= 3
    shot = tmp_path / "report.png"
    done = chromium(f"--screenshot={shot}", "--window-size=1200,2400", (out / "report.html").as_uri())
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    root, summary = batch_root
    dom = chromium("--dump-dom", (root / "index.html").as_uri())
    assert dom.returncode == 0, dom.stderr
    rows = re.findall(r'<tr class="model">', dom.stdout)
    assert len(rows) == len(summary["models"])
    assert all(m["name"] in text_of(dom.stdout) for m in summary["models"])


def test_each_check_shows_the_same_few_figures_in_the_terminal_markdown_and_page(converted):
    from mpconvert.render import markdown, render_summary

    out, report, _ = converted
    page = text_of((out / "report.html").read_text())
    terminal = io.StringIO()
    render_summary(Report.from_json(report), terminal)
    summary = markdown(Report.from_json(report)).replace("\\|", "|")
    checks = {c["name"]: c["values"] for c in report["gate"]["checks"]}
    onnx = checks["artifact parity: onnx"]
    sizes = [b["rows"] for b in onnx["batches"]]
    assert sizes[:2] == [0, 1] and onnx["rows"] == report["validation"]["rows"] == 143
    served = ", ".join(f"{b['rows']}: {b['max_abs_diff']:.3g}" for b in onnx["batches"])
    accuracy = checks["accuracy gate"]
    agreement = checks["agreement"]
    expected = [
        f"max |diff| {onnx['max_abs_diff']:.3g}, limit {onnx['limit']:.3g}, rows 143; served rows {served}",
        f"accuracy {accuracy['reference']:.4f} -> {accuracy['converted']:.4f}, drop {accuracy['drop']:.4f}, max 0.0100",
        f"kept correct {agreement['kept_correct']:.2%}, min 95.00%, rows {agreement['rows']}",
        f"20 of 20 steps, {checks['fine-tune health']['skipped_steps']} skipped",
    ]
    for figures in expected:
        assert figures in page and figures in summary and figures in terminal.getvalue(), figures
    for rendering in (page, summary, terminal.getvalue()):
        assert "batches rows 0" not in rendering and "error none" not in rendering  # no raw dump


def test_a_batch_a_file_cannot_serve_shows_its_error_beside_the_sizes_it_served():
    from mpconvert.render.figures import check_figures
    from mpconvert.report.checks import Check, ParityValues, ServedParity
    from mpconvert.report.sections.artifacts import ServedBatch

    batches = (
        ServedParity(ServedBatch(0, "Reshape: {0,-1,8} is ambiguous", None), False),
        ServedParity(ServedBatch(1, None, 1.5e-09), True),
        ServedParity(ServedBatch(4096, None, None), False),
    )
    values = ParityValues(0.0004, 1.0, 1e-05, 0.02, 0.02001, 256, batches=batches)
    shown = check_figures(Check("artifact parity: onnx", False, "", values))
    assert shown == (
        "max |diff| 0.0004, limit 0.02, rows 256; served rows 0: failed (Reshape: {0,-1,8} is ambiguous), "
        "1: 1.5e-09, 4096: not finite"
    )
