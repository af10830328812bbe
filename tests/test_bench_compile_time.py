"""bench/compile_time.py on the CPU: a child compiles in its own process and reports its seconds and tilefuse's
phases; a child that fails is a row with its error, not a crash of the table."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import compile_time

from tilefuse.lowering.lower import TEMPLATES


def test_a_fresh_process_compiles_and_says_where_the_time_went(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_MEASURE", "1")  # (the test session turns the measured choice off; users have it)
    prof = tmp_path / "mlp.prof"
    row = compile_time.run_child("mlp", "tiny", "tilefuse", str(tmp_path), timeout=600, profile=str(prof))
    assert "error" not in row, row
    assert prof.exists() and "cumulative time" in (tmp_path / "mlp.prof.txt").read_text()  # where it went
    assert row["seconds"] > 0 and row["graphs"] >= 1
    assert {"plan", "lower", "measured_choice"} <= set(row["phases"])
    assert sum(row["phases"][k] for k in ("plan", "lower", "measured_choice")) <= row["seconds"]
    assert (tmp_path / "tuning.json").exists()  # its caches were the ones given, not the user's


def test_a_failing_child_is_a_row_with_its_error(tmp_path):
    row = compile_time.run_child("no-such-model", "tiny", "tilefuse", str(tmp_path), timeout=600)
    assert row["compiler"] == "tilefuse" and "no-such-model" in row["error"]


def test_an_unknown_compiler_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["compile_time.py", "--compilers", "tilefuse,tvm"])
    try:
        compile_time.main()
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("an unknown compiler ran")
    assert "tvm" in capsys.readouterr().err


def test_the_timeline_gives_each_kernels_compile_steps_by_thread(tmp_path, capsys):
    row = compile_time.run_child("mlp", "tiny", "tilefuse", str(tmp_path), timeout=600, timeline=True)
    assert "error" not in row, row
    kernels = [s for s in row["spans"] if s[1] == "kernel"]
    assert kernels and all(s[0].startswith("tilefuse-compile") for s in kernels)  # (compiled in the worker threads)
    assert any(s[1] == "prim func built" for s in row["spans"])
    assert all(0 <= a <= b <= row["seconds"] for _, _, a, b in row["spans"])
    passes = [s for s in row["spans"] if s[1] == "TIR passes"]  # (TileLang's lowering, inside each kernel's span)
    assert len(passes) == len(kernels) and all(s[0].startswith("tilefuse-compile") for s in passes)
    compile_time.print_spans(row["spans"])
    assert "kernel" in capsys.readouterr().out
    labelled = row["kernels"]  # (each kernel's compile by the template and config it was built from)
    assert len(labelled) == len(kernels) and all(what.split()[0] in TEMPLATES for _, what, _, _ in labelled), labelled
    compile_time.summarize([{**row, "caches": "cold"}, {**row, "caches": "warm"}])  # (--summarize: by step, cold)
    out = capsys.readouterr().out
    assert max(labelled, key=lambda k: k[3] - k[2])[1] in out  # (the longest compiles, named)
    assert out.count("mlp tilefuse cold") == 1 and f"kernel           {len(kernels):4d} spans" in out
    assert "TIR passes" in out and "threads, busy" in out
