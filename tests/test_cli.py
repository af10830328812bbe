"""The command line: explain (text, JSON, SVG, HTML) for zoo models and ONNX files; compile errors."""

import json
import subprocess
import sys

import pytest

from tilefuse import cli, models


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_explain_every_zoo_model(name, tmp_path, capsys):
    svg, html = tmp_path / "p.svg", tmp_path / "p.html"
    assert cli.main(["explain", name, "--target", "c", "--json", "--svg", str(svg), "--html", str(html)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] > 0 and doc["kernels"] == len(doc["regions"])
    for r in doc["regions"]:
        assert set(r) == {"name", "kind", "ops", "inputs", "outputs", "backend"}
        assert r["backend"] in ("tilelang", "torch") and r["kind"] in (
            "gemm", "gemm_sp", "attention", "reduction", "elementwise", "opaque")
    assert svg.read_text().startswith("<svg") and "<table" in html.read_text()
    assert cli.main(["explain", name, "--target", "c"]) == 0
    text = capsys.readouterr().out
    assert "compute nodes ->" in text and "MB" in text


def test_explain_onnx_file_and_reasons(tmp_path, capsys):
    path = models.export_onnx("gpt2", tmp_path / "gpt2.onnx")
    assert cli.main(["explain", str(path), "--target", "c"]) == 0
    out = capsys.readouterr().out
    assert "refused fusions:" in out
    # the attention region lowers now (flash_attention template); its row says so
    assert any(" attention " in line and " tilelang " in line for line in out.splitlines()), out


def test_bad_inputs_give_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a model")
    assert cli.main(["compile", str(bad)]) == 2
    assert "bad.onnx" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["explain", "no_such_model"])


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "tilefuse.cli", "--help"], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "explain" in out.stdout
