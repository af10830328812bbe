"""The command line: explain (text, JSON, SVG, HTML) for zoo models and ONNX files; compile errors."""

import json
import subprocess
import sys

import pytest

from tilefuse import cli, models

C = {"kind": "c"}


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_explain_every_zoo_model(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path / "empty.json"))  # no stored choices to show
    svg, html = tmp_path / "p.svg", tmp_path / "p.html"
    assert cli.main(["explain", name, "--target", "c", "--json", "--svg", str(svg), "--html", str(html)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] > 0 and doc["kernels"] == len(doc["regions"])
    for r in doc["regions"]:
        assert set(r) == {"name", "kind", "ops", "inputs", "outputs", "backend", "pattern"}
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


def test_explain_shows_the_measured_choices_the_tuning_database_holds(tmp_path, monkeypatch, capsys):
    """Regions the database has measured say how they run (kernel, torch or split) and on what times; the others
    say nothing. Nothing is compiled or timed."""
    from tilefuse.lowering import tuning_db
    from tilefuse.lowering.builders import KernelSpec
    from tilefuse.lowering.dispatch import build
    from tilefuse.pipeline import plan

    monkeypatch.setenv(tuning_db.DB_ENV, str(tmp_path / "tuning.json"))
    p = plan(cli._load_graph("mlp", "tiny"), C)
    gemms = [r for r in p.regions if r.kind == "gemm" and isinstance(build(r, p.graph, C), KernelSpec)]
    assert len(gemms) >= 2
    db = tuning_db.TuningDB()
    db.put(build(gemms[0], p.graph, C), C, {"kernel_ms": 0.2, "torch_ms": 0.1, "torch": True, "split": False}, "choice")
    db.put(build(gemms[1], p.graph, C), C, {"config": {"block_M": 32}}, "")
    assert cli.main(["explain", "mlp", "--target", "c", "--json"]) == 0
    regions = {r["name"]: r for r in json.loads(capsys.readouterr().out)["regions"]}
    assert regions[gemms[0].name]["measured"] == {"runs": "torch", "kernel_ms": 0.2, "torch_ms": 0.1}
    assert regions[gemms[1].name]["measured"] == {"config": {"block_M": 32}}
    assert sum("measured" in r for r in regions.values()) == 2
    assert cli.main(["explain", "mlp", "--target", "c"]) == 0
    out = capsys.readouterr().out
    assert f"{gemms[0].name}" in out and "runs as torch (kernel 0.200 ms, torch 0.100 ms)" in out


def _onnx_with(nodes, path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cycle_and_dangling_input_errors_are_whole_sentences(tmp_path, capsys):
    from onnx import helper

    cycle = _onnx_with([helper.make_node("Add", ["x", "c"], ["b"], name="add1"),
                        helper.make_node("Relu", ["b"], ["c"], name="relu1")], tmp_path / "cycle.onnx")
    dangling = _onnx_with([helper.make_node("Add", ["x", "zz"], ["c"], name="add2")], tmp_path / "dangling.onnx")
    assert cli.main(["compile", str(cycle)]) == 2
    err = capsys.readouterr().err
    assert "cycle.onnx" in err and ("input 'c' of node 'add1' (Add) is not made by any node before it: the graph "
                                    "has a cycle or its nodes are not in topological order.") in err, err
    assert cli.main(["compile", str(dangling)]) == 2
    err = capsys.readouterr().err
    assert ("input 'zz' of node 'add2' (Add) is not made by any node before it: no node, graph input or initializer "
            "makes it (a dangling input).") in err, err


def test_compile_or_serve_a_directory_says_it_is_one(tmp_path, capsys):
    assert cli.main(["compile", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is a directory, not an ONNX file" in err and "no such" not in err, err
    assert cli.main(["serve", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is a directory" in err, err


def test_an_unknown_zoo_model_or_size_is_an_error_not_a_traceback(capsys):
    assert cli.main(["demo", "--model", "gpt3"]) == 2
    assert "unknown zoo model 'gpt3'" in capsys.readouterr().err
    assert cli.main(["demo", "--size", "huge"]) == 2
    assert "no size 'huge'" in capsys.readouterr().err


def test_a_cuda_arch_that_does_not_exist_stops_the_compile(capsys):
    """A typo'd arch compiled every kernel into an nvcc failure and ran the whole model through torch, "compiled"."""
    assert cli.main(["compile", "mlp", "--target", "cuda:sm_12"]) == 2
    err = capsys.readouterr().err
    assert "unknown CUDA arch 'sm_12'" in err and "sm_90a" in err


def test_compile_a_zoo_model_builds_it_at_the_size_asked(tmp_path, capsys, monkeypatch):
    """``compile mlp --size small`` exported the tiny model (the size went unused on the local and CUDA targets)."""
    monkeypatch.setenv("TILEFUSE_TUNING_DB", str(tmp_path / "db.json"))
    asked = []

    def export(name, path, size="tiny", **kw):
        asked.append(size)
        return models.export_onnx.__wrapped__(name, path, size, **kw)

    export.__wrapped__ = models.export_onnx
    monkeypatch.setattr(models, "export_onnx", export)
    assert cli.main(["compile", "mlp", "--size", "small", "--target", "c", "-q"]) == 0
    assert asked == ["small"] and "compiled mlp for" in capsys.readouterr().out
