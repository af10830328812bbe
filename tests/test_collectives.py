"""Collectives (issue #17 item 5), on one process: the fx frontend maps ``_c10d_functional`` ops onto registry ops
with the ``collective`` trait; the planner keeps each alone in a ``collective`` region, in program order, never
fused, dropped or duplicated; the eager tail never separates a collective from its wait; ``from_rank0`` hands out
rank 0's answer only where the plan carries collectives. (Running them takes several ranks:
tests/test_distributed_gloo.py.)"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tilefuse import ops
from tilefuse.frontends.fx import import_fx_program
from tilefuse.ir import TensorType
from tilefuse.ops import GraphBuilder
from tilefuse.pipeline import plan
from tilefuse.planner import legality
from tilefuse.planner.plan import FusionPlan, Region
from tilefuse.runtime.distributed import from_rank0, has_collectives
from tilefuse.runtime.plan_runner import collectives_together, eager_tail
from tilefuse.runtime.serialize import plan_from_json, plan_to_json

c10d = torch.ops._c10d_functional
T = TensorType((4, 8), "float32")


def traced():
    """An ATen graph with each kind of collective, a wait nobody reads and a collective without a converter."""
    def f(x, y):
        w = c10d.wait_tensor(c10d.all_reduce(torch.relu(x), "sum", "0"))
        g = c10d.wait_tensor(c10d.all_gather_into_tensor(y, 2, "0"))
        r = c10d.wait_tensor(c10d.reduce_scatter_tensor(g * 2, "sum", 2, "0"))
        c10d.wait_tensor(c10d.all_reduce(y, "max", "0"))  # its result is unused: it must still run, in order
        co = c10d.all_reduce_coalesced([x, y], "sum", "0")
        return w + 1, r, c10d.wait_tensor(co[0])

    args = [torch.randn(4, 8), torch.randn(4, 8)]
    return import_fx_program(make_fx(f, tracing_mode="fake")(*args), args)


def collective_ops(graph) -> list[tuple[str, str]]:
    return [(n.name, n.op) for n in graph.nodes if n.op in ops.COLLECTIVES]


def test_the_fx_frontend_maps_collectives_and_keeps_an_unread_one():
    program = traced()
    g = program.graph
    assert [op for _, op in collective_ops(g)] == [
        "all_reduce", "wait_tensor", "all_gather_into_tensor", "wait_tensor", "reduce_scatter_tensor", "wait_tensor",
        "all_reduce", "wait_tensor", "collective_fallback", "wait_tensor"]
    nodes = {n.name: n for n in g.nodes}
    assert nodes["all_reduce"].attr == {"reduce_op": "sum", "group_name": "0"}
    assert nodes["all_gather_into_tensor"].outputs[0].type == TensorType((8, 8), "float32")  # 2 ranks' rows
    assert nodes["reduce_scatter_tensor"].outputs[0].type == TensorType((4, 8), "float32")  # half of 8 rows
    assert nodes["all_reduce_coalesced"].attr["target"] == "_c10d_functional::all_reduce_coalesced.default"
    # the unread wait is returned by the graph (no pass may drop it), beyond what the fx graph returns
    assert g.outputs[-1] == "wait_tensor_3" and len(g.outputs) == 4
    assert "_c10d_functional::all_reduce.default" not in program.fallback_ops


def test_each_collective_runs_alone_in_program_order_never_fused_dropped_or_duplicated():
    g = traced().graph
    p = plan(g, {"kind": "c"})
    assert collective_ops(p.graph) == collective_ops(g)  # none dropped, none duplicated, same order
    regions = [r for r in p.regions if r.kind == "collective"]
    assert [r.nodes for r in regions] == [(name,) for name, _ in collective_ops(g)]  # one region each, in order
    assert all(r.backend == "torch" and r.anchor is None for r in regions)
    assert not any(n in {name for name, _ in collective_ops(g)} for r in p.regions if r.kind != "collective"
                   for n in r.nodes)
    text = p.to_text()
    assert "collective  torch" in text and "all_reduce is a collective: alone in its region, in program order" in text


def _crossing_graph():
    """``m = a * w2`` would join ``a = relu(x)``'s region: a region that must run before ``c1`` (it feeds it) and
    after ``c2`` (it reads its wait), putting ``c2`` before ``c1``."""
    b = GraphBuilder("crossing")
    x, y = b.input("x", T), b.input("y", T)
    a = b.add1("relu", [x], name="a")
    w1 = b.add1("wait_tensor", [b.add1("all_reduce", [a], name="c1", reduce_op="sum", group_name="0")], name="w1")
    w2 = b.add1("wait_tensor", [b.add1("all_reduce", [y], name="c2", reduce_op="sum", group_name="0")], name="w2")
    m = b.add1("mul", [a, w2], name="m")
    return b.build([b.add1("add", [w1, m], name="out")])


def _collective_order(p) -> list[str]:
    return [r.nodes[0] for r in p.regions if r.kind == "collective"]


def test_a_fusion_that_would_reorder_the_collectives_is_refused(monkeypatch):
    p = plan(_crossing_graph())
    assert _collective_order(p) == ["c1", "w1", "c2", "w2"]
    region = p.region_of()
    assert region["a"] is not region["m"]
    assert any(w.startswith("m (mul) not fused") and "cycle" in w for w in p.refusals)
    # the hazard is real: without the program-order edges the same plan issues c2 before c1
    monkeypatch.setattr(legality, "collective_order", lambda graph: [])
    assert _collective_order(plan(_crossing_graph())) == ["c2", "w2", "c1", "w1"]


def _hand_plan(outputs: tuple[str, ...]) -> FusionPlan:
    """linear -> all_reduce -> wait -> add, one region each, the graph returning ``outputs`` (of h, w, y)."""
    b = GraphBuilder("tail")
    x = b.input("x", T)
    h = b.add1("linear", [x, b.constant("weight", torch.randn(8, 8)), ""], name="h")
    ar = b.add1("all_reduce", [h], name="ar", reduce_op="sum", group_name="0")
    w = b.add1("wait_tensor", [ar], name="w")
    y = b.add1("add", [w, x], name="y")
    g = b.build([{"h": h, "w": w, "y": y}[o] for o in outputs])
    regions = (Region("linear_0", "gemm", ("h",), ("linear",), (x, "weight"), (h,), "h", None, "tilelang"),
               Region("all_reduce_1", "collective", ("ar",), ("all_reduce",), (h,), (ar,)),
               Region("wait_tensor_2", "collective", ("w",), ("wait_tensor",), (ar,), (w,)),
               Region("add_3", "elementwise", ("y",), ("add",), (w, x), (y,), None, None, "tilelang"))
    return FusionPlan(g, regions)


def test_the_eager_tail_never_starts_between_a_collective_and_its_wait():
    p = _hand_plan(("w", "y"))  # the last two regions write outputs: the tail would start at the wait
    assert collectives_together(p, 2) == 3  # ... so it starts after it
    assert eager_tail(p) == 3
    assert [collectives_together(p, s) for s in range(5)] == [0, 1, 3, 3, 4]  # a cut elsewhere stays
    assert eager_tail(_hand_plan(("h", "w"))) == 4  # the wait was all of the tail: no tail
    assert eager_tail(_hand_plan(("y",))) == 3  # no collective in the way: the tail as before


def test_from_rank0_broadcasts_only_where_the_plan_has_collectives():
    with_collectives = _hand_plan(("y",))
    without = FusionPlan(with_collectives.graph, with_collectives.regions[:1])
    assert has_collectives(with_collectives) and not has_collectives(without)
    sent = []

    def rank1(box):  # a rank other than 0: its value is replaced by rank 0's
        sent.append(box[0])
        box[0] = "rank 0's"

    assert from_rank0("mine", with_collectives, rank1) == "rank 0's" and sent == ["mine"]
    assert from_rank0("mine", without, rank1) == "mine" and sent == ["mine"]
    assert not has_collectives(None) and from_rank0("mine", None, rank1) == "mine" and sent == ["mine"]  # no plan
    assert from_rank0("mine", with_collectives) == "mine"  # torch.distributed not initialized here: one process


def test_rank0s_answers_travel_through_the_store_in_order_never_as_collectives(monkeypatch):
    """``from_rank0``'s default broadcast: rank 0 sets the n-th key of the default group's store, the others read it;
    no collective runs (a planning broadcast among the model's gloo collectives hung in 2 of 9 loaded runs)."""
    from tilefuse.runtime import distributed

    class Store(dict):
        def set(self, key, value):
            self[key] = value

        def get(self, key):  # (a real store waits for the key)
            return self[key]

    store, rank = Store(), [0]
    monkeypatch.setattr(distributed.dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: rank[0])
    monkeypatch.setattr(distributed.dist, "broadcast_object_list", lambda *a, **k: pytest.fail("a collective ran"))
    monkeypatch.setattr(distributed, "_ANSWERS", itertools.count())  # (per process: rank 1 below counts anew)
    for value in ({"runs": "torch"}, [1, 2]):
        box = [value]
        distributed._broadcast_object(box)
        assert box == [value]
    assert list(store) == ["tilefuse/from_rank0/0", "tilefuse/from_rank0/1"]
    rank[0] = 1
    monkeypatch.setattr(distributed, "_ANSWERS", itertools.count())
    got = []
    for mine in ("a", "b"):
        box = [mine]
        distributed._broadcast_object(box)
        got.append(box[0])
    assert got == [{"runs": "torch"}, [1, 2]]


@pytest.mark.parametrize("op, attrs, shape", [
    ("all_gather_into_tensor", {"group_size": 4, "group_name": "0"}, (16, 8)),
    ("reduce_scatter_tensor", {"reduce_op": "avg", "group_size": 2, "group_name": "0"}, (2, 8)),
    ("all_to_all_single", {"output_split_sizes": (3, 5), "input_split_sizes": (2, 2), "group_name": "0"}, (8, 8)),
    ("all_to_all_single", {"output_split_sizes": (), "input_split_sizes": (), "group_name": "0"}, (4, 8)),
    ("rank_broadcast", {"src": 1, "group_name": "0"}, (4, 8)),
])
def test_collective_types_come_from_the_attributes(op, attrs, shape):
    assert ops.infer_types(op, [T], attrs) == [TensorType(shape, "float32")]
    assert "collective" in ops.get(op).traits and ops.get(op).kind == ops.OpKind.OPAQUE


def test_a_plan_with_collectives_survives_an_artifact_round_trip():
    """The plan's JSON (what an artifact stores) keeps the collective regions, their kind and their order."""
    program = traced()
    p = plan(program.graph, {"kind": "c"})
    back = plan_from_json(plan_to_json(p), program.graph.constants)
    assert [(r.name, r.kind, r.nodes) for r in back.regions] == [(r.name, r.kind, r.nodes) for r in p.regions]
    assert sum(r.kind == "collective" for r in back.regions) == 10


def test_a_rank_that_cannot_plan_a_graph_with_collectives_stops_instead_of_running_it_alone(monkeypatch):
    """Several ranks: running such a graph through torch on one rank only would leave the others waiting in the
    planning broadcasts it skips (a hang, as a gloo run of bench_tp once sat until its deadline). One process, or a
    graph without collectives, still runs through torch with the reason kept."""
    from tilefuse import backend

    def f(x):
        return c10d.wait_tensor(c10d.all_reduce(torch.relu(x), "sum", "0")) + 1

    x = torch.randn(4, 8)
    gm = make_fx(f, tracing_mode="fake")(x)
    plain = make_fx(lambda x: torch.relu(x) + 1, tracing_mode="fake")(x)

    def broken(*a, **k):
        raise ValueError("no kernel today")
    monkeypatch.setattr(backend, "build_runner", broken)
    be = backend.TilefuseBackend()
    assert callable(be.compile_graph(gm, [x], "g1")) and "g1: cannot plan (ValueError: no kernel today)" in be.failures
    monkeypatch.setattr(backend, "world_size", lambda: 2)
    with pytest.raises(backend.RankAlone, match="g2: cannot plan on rank 0 .ValueError: no kernel today.*could hang"):
        be.compile_graph(gm, [x], "g2")
    assert callable(be.compile_graph(plain, [x], "g3")) and len(be.failures) == 2  # (no collective: torch, as before)
