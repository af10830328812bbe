"""ONNX import and the ONNX Backend API: small hand-built models against onnxruntime, errors, dims.

Inputs are fresh random values (never zeros); every output element is compared (fp32: rtol 1e-5).
Models run through the import, the planner and the registry references (``lower=False``): kernel
numerics are the lowering tests' business.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import tilefuse
from tilefuse import onnx_backend
from tilefuse.frontends.onnx import OnnxImportError, UnsupportedOnnxOpError, fold_constants, import_onnx

OPSET = 18


@pytest.fixture
def rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def model(nodes, inputs, outputs, inits=(), opset=OPSET, name="m"):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def vi(name, dtype, shape):
    """A tensor value info; an int ``shape`` is a rank with unknown dims."""
    return helper.make_tensor_value_info(name, dtype, [None] * shape if isinstance(shape, int) else shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def randn(rng, *shape, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype)
    return np.where(x == 0, dtype(0.5), x)


def against_ort(m, feeds, rtol=1e-5, atol=1e-6):
    """Run ``m`` through tilefuse (backend API) and onnxruntime; compare every element. ``atol`` is relative to the
    output's largest magnitude: an element that cancels to near 0 in a sum of large terms carries their rounding
    (seen: -0.0031 out of a pooled convolution whose outputs reach 31, 1.5e-6 apart between torch and onnxruntime)."""
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = onnx_backend.prepare(m, lower=False).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        scale = float(np.abs(w).max(initial=0.0)) if w.dtype.kind == "f" and np.isfinite(w).all() else 0.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, scale))
    return got


# ---- numerics against onnxruntime ---------------------------------------------------------------

def test_mlp_gemm_softmax(rng):
    w1, b1, w2, b2 = randn(rng, 8, 16), randn(rng, 16), randn(rng, 10, 16), randn(rng, 10)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["g"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    m = model(nodes, [vi("x", T.FLOAT, [4, 8])], [vi("y", T.FLOAT, [4, 10])],
              [init("w1", w1), init("b1", b1), init("w2", w2), init("b2", b2)])
    against_ort(m, {"x": randn(rng, 4, 8)})


def test_conv_pool_net_with_asymmetric_and_auto_pads(rng):
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 1, 2, 1], strides=[2, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
        helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("Conv", ["a", "w2"], ["c2"], auto_pad="SAME_LOWER", dilations=[1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    inits = [init("w", randn(rng, 6, 3, 3, 3)), init("b", randn(rng, 6)), init("s", randn(rng, 6)),
             init("bb", randn(rng, 6)), init("mu", randn(rng, 6)), init("var", rng.uniform(0.5, 2, 6).astype(np.float32)),
             init("w2", randn(rng, 5, 6, 2, 2))]
    m = model(nodes, [vi("x", T.FLOAT, [2, 3, 11, 9])], [vi("y", T.FLOAT, [2, 5])], inits)
    against_ort(m, {"x": randn(rng, 2, 3, 11, 9)})


def test_tensor_ops(rng):
    i64 = lambda name, v: init(name, np.array(v, dtype=np.int64))
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["t", "st", "en", "ax", "sp"], ["s"]),
        helper.make_node("Pad", ["s", "pads"], ["p"], mode="reflect"),
        helper.make_node("Split", ["p"], ["a", "b"], axis=1, num_outputs=2),
        helper.make_node("Concat", ["b", "a"], ["c"], axis=1),
        helper.make_node("ReduceMean", ["c", "rax"], ["m"], keepdims=1),
        helper.make_node("Sub", ["c", "m"], ["d"]),
        helper.make_node("CumSum", ["d", "cax"], ["cs"], reverse=1),
        helper.make_node("TopK", ["cs", "k"], ["tv", "ti"], axis=-1),
        helper.make_node("Where", ["cond", "tv", "zero"], ["w"]),
        helper.make_node("Tile", ["w", "reps"], ["y"]),
        helper.make_node("Cast", ["ti"], ["yi"], to=T.INT32),
    ]
    inits = [i64("st", [5, 0]), i64("en", [-100, 4]), i64("ax", [1, 2]), i64("sp", [-2, 1]),
             i64("pads", [0, 1, 1, 0, 1, 1]), i64("rax", [-1]), i64("cax", 1), i64("k", [3]),
             i64("reps", [1, 2, 1]), init("zero", np.float32(0.25))]
    m = model(nodes, [vi("x", T.FLOAT, [2, 5, 7]), vi("cond", T.BOOL, [2, 1, 3])],
              [vi("y", T.FLOAT, 3), vi("yi", T.INT32, 3)], inits)
    # The cumulative sum runs along axis 1, not the mean's axis: along that one its first (reversed) element is the
    # sum of the deviations from their mean, exactly 0, and the two runtimes' rounding noise there (1.4e-6 apart on
    # values of 1.3) failed the comparison in about 3% of fresh inputs.
    against_ort(m, {"x": randn(rng, 2, 5, 7), "cond": rng.random((2, 1, 3)) > 0.5})


def test_layer_norm_resize_einsum_gather(rng):
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("Resize", ["ln", "", "scales"], ["r"], mode="linear"),
        helper.make_node("Einsum", ["r", "r"], ["e"], equation="nij,nkj->nik"),
        helper.make_node("GatherElements", ["e", "idx"], ["ge"], axis=2),
        helper.make_node("Gather", ["ge", "gidx"], ["y"], axis=1),
    ]
    idx = rng.integers(-6, 6, (1, 6, 2)).astype(np.int64)
    inits = [init("g", randn(rng, 4)), init("b", randn(rng, 4)),
             init("scales", np.array([1, 2, 1.5], np.float32)), init("idx", idx),
             init("gidx", np.array([[0, -1], [2, 3]], np.int64))]
    m = model(nodes, [vi("x", T.FLOAT, [1, 3, 4])], [vi("y", T.FLOAT, 4)], inits)
    # The einsum sums products of magnitude ~10 (layer norm times a random gamma), so an output
    # near zero carries fp32 rounding of ~10 * 2^-23 = 1.2e-6 in either runtime: atol 1e-5.
    against_ort(m, {"x": randn(rng, 1, 3, 4)}, atol=1e-5)


def test_shape_arithmetic_folds_into_a_static_reshape(rng):
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [init("zero", np.array(0, np.int64)), init("zero1", np.array([0], np.int64)),
             init("minus1", np.array([-1], np.int64))]
    m = model(nodes, [vi("x", T.FLOAT, [3, 4, 5])], [vi("y", T.FLOAT, [3, 20])], inits)
    g = import_onnx(m)
    assert g.op_counts() == {"reshape": 1}
    assert g.nodes[0].attr["shape"] == (3, 20)
    against_ort(m, {"x": randn(rng, 3, 4, 5)})


def test_symbolic_dims_survive_and_run_at_any_size(rng):
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["b"]),
        helper.make_node("Concat", ["b", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w"], ["y"]),
    ]
    inits = [init("zero", np.array([0], np.int64)), init("one", np.array([1], np.int64)),
             init("minus1", np.array([-1], np.int64)), init("w", randn(rng, 12, 5))]
    m = model(nodes, [vi("x", T.FLOAT, ["batch", 3, 4])], [vi("y", T.FLOAT, ["batch", 5])], inits)
    g = import_onnx(m)
    assert g.inputs[0].type.shape == ("batch", 3, 4)
    assert g.output_values()[0].type.shape[-1] == 5
    for batch in (1, 6):
        against_ort(m, {"x": randn(rng, batch, 3, 4)})


def test_dtypes_float16_int64_bool(rng):
    nodes = [
        helper.make_node("Mul", ["h", "h"], ["hh"]),
        helper.make_node("Div", ["i", "j"], ["q"]),
        helper.make_node("Mod", ["i", "j"], ["r"]),
        helper.make_node("Greater", ["i", "j"], ["gt"]),
        helper.make_node("Xor", ["gt", "flag"], ["x"]),
    ]
    m = model(nodes, [vi("h", T.FLOAT16, [3, 4]), vi("i", T.INT64, [3, 4]), vi("j", T.INT64, [4]),
                      vi("flag", T.BOOL, [3, 1])],
              [vi("hh", T.FLOAT16, [3, 4]), vi("q", T.INT64, [3, 4]), vi("r", T.INT64, [3, 4]),
               vi("x", T.BOOL, [3, 4])])
    j = rng.integers(1, 9, 4) * rng.choice([-1, 1], 4)
    feeds = {"h": randn(rng, 3, 4, dtype=np.float16), "i": rng.integers(-50, 50, (3, 4)).astype(np.int64),
             "j": j.astype(np.int64), "flag": rng.random((3, 1)) > 0.5}
    against_ort(m, feeds, rtol=1e-3)


def test_reductions_with_opset18_axes_inputs(rng):
    nodes = [helper.make_node(op, ["x", "axes"], [op], keepdims=k)
             for op, k in (("ReduceSum", 1), ("ReduceMax", 0), ("ReduceL2", 1), ("ReduceLogSumExp", 0),
                           ("ReduceSumSquare", 1), ("ReduceProd", 0))]
    nodes.append(helper.make_node("ArgMin", ["x"], ["am"], axis=1, keepdims=0, select_last_index=1))
    outs = [vi(n.output[0], T.FLOAT, 3 if n.attribute[0].i else 1) for n in nodes[:-1]] + [vi("am", T.INT64, 2)]
    m = model(nodes, [vi("x", T.FLOAT, [2, 3, 4]), vi("axes", T.INT64, [2])], outs)
    against_ort(m, {"x": randn(rng, 2, 3, 4), "axes": np.array([0, -1], np.int64)})


# ---- initializers, external data, constants -----------------------------------------------------

def test_initializers_of_every_storage(tmp_path, rng):
    w16 = randn(rng, 4, 4).astype(np.float16)
    big = randn(rng, 64, 64) / 8  # 4096-term sums stay near 1: fp32 summation order (ORT vs torch) stays under atol
    raw = numpy_helper.from_array(randn(rng, 4), "raw")
    typed = helper.make_tensor("typed", T.FLOAT, [4], randn(rng, 4).tolist(), raw=False)
    mask = rng.random(4) > 0.5
    nodes = [helper.make_node("Cast", ["w16"], ["w"], to=T.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["a"]),
             helper.make_node("Add", ["a", "raw"], ["b0"]), helper.make_node("Cast", ["i8"], ["i8f"], to=T.FLOAT),
             helper.make_node("Where", ["mask", "b0", "i8f"], ["b"]), helper.make_node("Add", ["b", "typed"], ["c"]),
             helper.make_node("MatMul", ["big", "big"], ["bb"]),
             helper.make_node("ReduceSum", ["bb"], ["s"], keepdims=0),
             helper.make_node("Add", ["c", "s"], ["y"])]
    m = model(nodes, [vi("x", T.FLOAT, [2, 4])], [vi("y", T.FLOAT, [2, 4])],
              [init("w16", w16), raw, typed, init("big", big), init("mask", mask),
               init("i8", rng.integers(-100, 100, 4).astype(np.int8))])
    path = tmp_path / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=1024)
    assert (tmp_path / "w.bin").exists()
    x = randn(rng, 2, 4)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tilefuse.compile_onnx(path, target="c", lower=False)(torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)


def test_bfloat16_initializer_is_exact():
    vals = np.array([1.5, -2.25, 3.0e38, 1e-3], dtype=np.float32)
    t = helper.make_tensor("c", T.BFLOAT16, [4], vals.tolist())
    m = model([helper.make_node("Cast", ["c"], ["y"], to=T.FLOAT)], [], [vi("y", T.FLOAT, [4])], [t])
    (y,) = onnx_backend.prepare(m).run([])
    want = torch.tensor(vals).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(y, want)


def test_graph_input_with_initializer_is_a_constant(rng):
    b = randn(rng, 3)
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g",
                          [vi("x", T.FLOAT, [3]), vi("b", T.FLOAT, [3])], [vi("y", T.FLOAT, [3])],
                          initializer=[init("b", b)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    graph = import_onnx(m)
    assert [v.name for v in graph.inputs] == ["x"]
    x = randn(rng, 3)
    np.testing.assert_allclose(onnx_backend.prepare(m).run([x])[0], x + b, rtol=1e-6)


def test_fold_constants_is_pure():
    from tilefuse.ir import TensorType
    from tilefuse.ops import GraphBuilder

    b = GraphBuilder("g")
    x = b.input("x", TensorType((2, 3), "float32"))
    c = b.constant("c", torch.ones(3))
    d = b.add1("add", [c, c])
    s = b.add1("shape_of", [x])
    g = b.build([b.add1("add", [x, d]), s])
    folded = fold_constants(g)
    assert folded is not g and [n.op for n in g.nodes] == ["add", "shape_of", "add"]
    assert [n.op for n in folded.nodes] == ["add"]
    assert torch.equal(folded.constants[s], torch.tensor([2, 3]))


# ---- errors ---------------------------------------------------------------------------------------

def _simple():
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu1")], [vi("x", T.FLOAT, [2, 3])],
                 [vi("y", T.FLOAT, [2, 3])])


def test_missing_file(tmp_path):
    with pytest.raises(OnnxImportError, match=r"nope\.onnx: no such ONNX file"):
        import_onnx(tmp_path / "nope.onnx")


def test_garbage_file(tmp_path, rng):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(OnnxImportError, match="garbage.onnx: "):
        import_onnx(path)


def test_text_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n")
    with pytest.raises(OnnxImportError, match="notes.onnx: .*(not an ONNX model|onnx.checker)"):
        import_onnx(path)


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.9])
def test_truncated_file(tmp_path, keep, rng):
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", T.FLOAT, [2, 8])],
              [vi("y", T.FLOAT, [2, 8])], [init("w", randn(rng, 8, 8))])
    data = m.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(OnnxImportError, match="cut.onnx: "):
        import_onnx(path)


def test_checker_failure(tmp_path):
    m = _simple()
    m.graph.node[0].input[0] = "undefined"
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(OnnxImportError, match="bad.onnx: fails onnx.checker"):
        import_onnx(path)


def test_unsupported_op_names_file_op_node_and_domain(tmp_path):
    g = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], name="fancy_7", domain="com.example")], "g",
                          [vi("x", T.FLOAT, [2])], [vi("y", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(m, str(path))
    with pytest.raises(UnsupportedOnnxOpError) as e:
        import_onnx(path)
    msg = str(e.value)
    assert all(s in msg for s in ("custom.onnx", "FancyOp", "fancy_7", "com.example")), msg


def test_control_flow_is_a_clear_error():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [vi("o", T.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], name="branchy", then_branch=branch, else_branch=branch)
    m = model([node], [vi("c", T.BOOL, []), vi("x", T.FLOAT, [2])], [vi("y", T.FLOAT, [2])])
    with pytest.raises(UnsupportedOnnxOpError, match="branchy.*If"):
        import_onnx(m)


def test_wrong_input_shape_at_run_time(rng):
    rep = onnx_backend.prepare(_simple())
    with pytest.raises(ValueError, match="input 'x' has shape \\(3, 3\\).*float32\\[2x3\\]"):
        rep.run([randn(rng, 3, 3)])
    with pytest.raises(ValueError, match="dtype"):
        rep.run([randn(rng, 2, 3).astype(np.float64)])
    with pytest.raises(ValueError, match="expected 1 inputs"):
        rep.run([])
    compiled = tilefuse.compile_onnx(_simple(), target="c")
    with pytest.raises(ValueError, match="shape"):
        compiled(torch.ones(2, 4))


# ---- the Backend API ----------------------------------------------------------------------------

def test_backend_api(rng):
    assert onnx_backend.supports_device("CPU")
    assert onnx_backend.supports_device("CUDA") == torch.cuda.is_available()
    x = randn(rng, 2, 3)
    out = onnx_backend.run_model(_simple(), [x])
    np.testing.assert_array_equal(out.y, np.maximum(x, 0))
    np.testing.assert_array_equal(out["y"], out[0])
    node = helper.make_node("Add", ["a", "b"], ["c"])
    (c,) = onnx_backend.run_node(node, [x, x])
    np.testing.assert_allclose(c, x + x)
    ints = rng.integers(-5, 5, (4,)).astype(np.int64)
    (i,) = onnx_backend.run_node(helper.make_node("Neg", ["a"], ["b"]), [ints])
    assert i.dtype == np.int64 and np.array_equal(i, -ints)


@pytest.mark.parametrize("op, shape, axis, why", [
    ("Softmax", [2, 3], -3, r"axis -3 is out of range for 'x' of rank 2 \(ONNX: -2 to 1\)"),
    ("LayerNormalization", [], -1, r"axis -1 is out of range for 'x' of rank 0 \(a 0-d value has no axis\)"),
    ("Unsqueeze", [2, 3], 3, r"axis 3 is out of range for the output of rank 3 \(ONNX: -3 to 2\)"),
    ("Pad", [2, 3], -3, r"axis -3 is out of range for 'x' of rank 2 \(ONNX: -2 to 1\)"),
    ("Gather", [2, 3], 2, r"axis 2 is out of range for 'x' of rank 2 \(ONNX: -2 to 1\)"),
    ("Flatten", [2, 3], 3, r"axis 3 is out of range for 'x' of rank 2 \(ONNX: -2 to 2\)"),
])
def test_an_axis_out_of_range_is_refused_by_name(tmp_path, op, shape, axis, why):
    """An axis past the rank was taken modulo the rank: Softmax(axis=-3) of a 2-d input ran over dim 1, Unsqueeze and
    Pad picked another dim, silent wrong answers where onnxruntime refuses the model; a 0-d LayerNormalization divided
    by zero. Each is now refused, naming the node, the axis and the range."""
    inputs, inits, attrs = ["x"], [], {"axis": axis}
    if op == "LayerNormalization":
        inputs, inits = ["x", "s"], [init("s", np.float32(1.0))]
    elif op == "Unsqueeze":  # (its axes an input, into the output's rank)
        inputs, inits, attrs = ["x", "axes"], [init("axes", np.array([axis], np.int64))], {}
    elif op == "Gather":
        inputs, inits = ["x", "i"], [init("i", np.array([0], np.int64))]
    elif op == "Pad":
        inputs, attrs = ["x", "pads", "", "axes"], {}
        inits = [init("pads", np.array([1, 1], np.int64)), init("axes", np.array([axis], np.int64))]
    out = [vi("y", T.FLOAT, len(shape) + (op == "Unsqueeze"))]
    m = model([helper.make_node(op, inputs, ["y"], name="n", **attrs)], [vi("x", T.FLOAT, shape)], out, inits)
    path = tmp_path / "axis.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(OnnxImportError, match=f"axis.onnx: node 'n' \\(op '{op}'.*{why}"):
        import_onnx(path)


@pytest.mark.parametrize("coords,nearest,scales", [
    ("asymmetric", "floor", [1, 1, 2, 2]),  # ONNX's Upsample and older Resize
    ("half_pixel", "round_prefer_floor", [1, 1, 2, 3]),  # the default modes
    ("pytorch_half_pixel", "round_prefer_ceil", [1, 1, 1, 4]),
    ("asymmetric", "floor", [1, 1, 1, 1]),
])
def test_a_nearest_resize_by_whole_factors_is_a_repetition_that_fuses(rng, coords, nearest, scales):
    """A YOLO's or a VAE decoder's 2x nearest upsample: each element repeated, as reshape/expand/reshape that the
    elementwise kernels take (the ``resize`` op is opaque: it runs through torch). Against onnxruntime, with the
    ReLU before it fused into the same kernel."""
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("Resize", ["h", "", "scales"], ["y"], mode="nearest",
                              coordinate_transformation_mode=coords, nearest_mode=nearest)]
    m = model(nodes, [vi("x", T.FLOAT, [2, 3, 5, 4])], [vi("y", T.FLOAT, 4)],
              [init("scales", np.array(scales, np.float32))])
    against_ort(m, {"x": randn(rng, 2, 3, 5, 4)}, rtol=0, atol=0)
    p = tilefuse.compile_onnx(m, target="c", measure=False).plan
    assert "resize" not in {op for r in p.regions for op in r.ops} and all(r.backend == "tilelang" for r in p.regions
                                                                             if r.kind != "view"), p.to_text()


@pytest.mark.parametrize("coords,nearest,scales", [
    ("half_pixel", "floor", [1, 1, 2, 2]),  # floor of o/2 - 0.25 is not o // 2
    ("asymmetric", "round_prefer_ceil", [1, 1, 2, 2]),
    ("align_corners", "round_prefer_floor", [1, 1, 2, 2]),
    ("asymmetric", "floor", [1, 1, 1.5, 2]),
])
def test_other_nearest_resizes_stay_resizes_and_match_onnxruntime(rng, coords, nearest, scales):
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest",
                              coordinate_transformation_mode=coords, nearest_mode=nearest)]
    m = model(nodes, [vi("x", T.FLOAT, [1, 2, 4, 6])], [vi("y", T.FLOAT, 4)],
              [init("scales", np.array(scales, np.float32))])
    against_ort(m, {"x": randn(rng, 1, 2, 4, 6)}, rtol=0, atol=0)
    p = tilefuse.compile_onnx(m, target="c", measure=False).plan
    assert "resize" in {op for r in p.regions for op in r.ops}, p.to_text()
