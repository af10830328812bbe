"""Progress lines while tuning and compiling: counts and time left (fake clock), terminal vs log output,
``quiet``, and the command line's ``--quiet``."""

from __future__ import annotations

import io
import threading

import pytest

from tilefuse import cli
from tilefuse.progress import Progress, format_seconds, wanted


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_counts_and_time_left_with_a_fake_clock():
    clock, out = Clock(), io.StringIO()
    bar = Progress("compiling m", 40, "kernels", stream=out, clock=clock, tty=False, interval=0)
    assert bar.line() == "compiling m: 0/40 kernels"  # nothing finished: no guess yet
    clock.now += 6.0
    bar.tick(12)
    assert out.getvalue() == "compiling m: 12/40 kernels, ~14 s left\n"  # 0.5 s per kernel, 28 left
    clock.now += 4.0
    bar.tick(28)  # the last item: close() prints the final line
    bar.close()
    bar.close()
    assert out.getvalue().splitlines() == ["compiling m: 12/40 kernels, ~14 s left", "compiling m: 40/40 kernels in 10.0 s"]


def test_time_left_is_bounded_by_the_cap():
    clock = Clock()
    bar = Progress("tuning m", 10, stream=io.StringIO(), clock=clock, limit_s=30.0, tty=False)
    assert bar.line() == "tuning m: 0/10 kernels, at most 30 s left"  # before any item: the cap alone
    clock.now += 20.0
    bar.tick()
    assert bar.seconds_left() == 10.0  # 180 s at this pace, but tuning stops at the cap
    clock.now += 40.0
    assert bar.seconds_left() == 0.0


def test_format_seconds():
    assert [format_seconds(s) for s in (0.2, 8, 59.5, 125, 180, 3725)] == [
        "1 s", "8 s", "1 min", "2 min 5 s", "3 min", "1 h 2 min"]


def test_terminal_redraws_one_line():
    clock, out = Clock(), Tty()
    with Progress("compiling m", 3, stream=out, clock=clock) as bar:  # a terminal: redrawn in place
        for _ in range(3):
            clock.now += 1.0
            bar.tick()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.rsplit("\r", 1)[1].rstrip() == "compiling m: 3/3 kernels in 3.0 s"  # blanks the longer line out
    assert "\rcompiling m: 1/3 kernels, ~2 s left" in text and "\rcompiling m: 2/3 kernels, ~1 s left" in text


def test_a_log_gets_few_lines():
    clock, out = Clock(), io.StringIO()
    with Progress("compiling m", 200, stream=out, clock=clock, tty=False) as bar:
        for _ in range(200):
            clock.now += 0.25  # 50 s in all: a line every 10 s, not one per kernel
            bar.tick()
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 6 and lines[-1] == "compiling m: 200/200 kernels in 50.0 s"
    assert "\r" not in out.getvalue()


def test_ticks_from_threads():
    out = io.StringIO()
    with Progress("compiling m", 800, stream=out, tty=False) as bar:
        threads = [threading.Thread(target=lambda: [bar.tick() for _ in range(100)]) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert bar.done == 800 and out.getvalue().splitlines()[-1].startswith("compiling m: 800/800 kernels in ")


def test_disabled_or_empty_prints_nothing():
    for bar in (Progress("m", 5, stream=(out := Tty()), enabled=False), Progress("m", 0, stream=out)):
        bar.tick()
        bar.close()
    assert out.getvalue() == ""


def test_wanted():
    assert wanted(True, Tty()) is False and wanted(False, io.StringIO()) is True
    assert wanted(None, Tty()) is True and wanted(None, io.StringIO()) is False  # the API: terminals only


@pytest.fixture
def small_onnx(tmp_path):
    """A two-region ONNX model (MatMul + Relu, Softmax): two small kernels on ``c``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "progress_small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cli_compile_shows_progress_unless_quiet(small_onnx, tmp_path, capfd):
    assert cli.main(["compile", str(small_onnx), "-o", str(tmp_path / "a.tfz"), "--target", "c"]) == 0
    err = capfd.readouterr().err
    assert "compiling progress_small: " in err and " kernels in " in err, err  # not a terminal: plain lines
    assert cli.main(["compile", str(small_onnx), "-o", str(tmp_path / "b.tfz"), "--target", "c", "--quiet"]) == 0
    captured = capfd.readouterr()
    assert "compiling progress_small" not in captured.err and "kernels," not in captured.err, captured.err
    assert "compiled " in captured.out  # the summary still prints


def test_api_default_is_silent_off_a_terminal(small_onnx, capfd):
    import tilefuse

    tilefuse.compile_onnx(small_onnx, target="c")
    assert "compiling progress_small" not in capfd.readouterr().err
