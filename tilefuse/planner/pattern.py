"""A small pattern language over the graph IR, and the rewrite engine that applies a table of them.

Note: a pattern is a tree of ``Op`` nodes whose leaves are capture names (strings, or ``Scalar`` for a
constant only). The same capture
name used twice must bind the same value (``x * rsqrt(mean(x^2))`` needs both ``x`` to be one
value). ``Op(..., commutative=True)`` also tries its two inputs swapped. A ``Pattern`` adds a name
(``family.detail``), a check on the captures (returns ``None`` when the match is good, else the
reason it is refused) and a rewrite that returns the replacement nodes for the root's outputs.
Matched interior nodes are removed when nothing else reads them (dead-code elimination).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from tilefuse import ops
from tilefuse.ir import Graph, Node, TensorType, prune
from tilefuse.ops import GraphBuilder


@dataclass(frozen=True)
class Op:
    """Match a node whose op is ``op`` (or one of a tuple of ops) with inputs matching ``inputs``.

    ``name`` captures the node itself; ``out`` selects which output of a multi-output node.
    Fewer sub-patterns than inputs leaves the rest unchecked.
    """

    op: str | tuple[str, ...]
    inputs: tuple[PatternLike, ...] = ()
    name: str | None = None
    commutative: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)

    def ops(self) -> tuple[str, ...]:
        return self.op if isinstance(self.op, tuple) else (self.op,)


@dataclass(frozen=True)
class Opt:
    """Optional unary step: matches ``Op(op, (inner,))`` or ``inner`` itself (a cast, a contiguous...)."""

    op: str | tuple[str, ...]
    inner: PatternLike
    name: str | None = None


@dataclass(frozen=True)
class Prod:
    """A product of ``factors`` in any order and any nesting of binary ``mul`` nodes:
    ``Prod("x", "half", y)`` matches ``(x * 0.5) * y``, ``x * (0.5 * y)``, ``0.5 * (y * x)``..."""

    factors: tuple[PatternLike, ...]
    name: str | None = None


@dataclass(frozen=True)
class Scalar:
    """A capture that binds only a constant with one distinct value (``ctx.scalar`` is not None): in a
    commutative ``mul(x, Scalar("s"))`` the scale is told from the tensor it scales, whichever side it is on."""

    name: str


PatternLike = Union[Op, Opt, Prod, Scalar, str]  # noqa: UP007  (a runtime alias of forward-declared classes)


class Context:
    """What a matcher and a check read: the graph, its producers, users and constants."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producers = graph.producers()
        self.users = graph.users()
        self.values = graph.values()

    def type(self, value: str) -> TensorType:
        return self.values[value].type

    def const(self, value: str) -> torch.Tensor | None:
        """The tensor behind ``value`` when it is a constant (through casts/views of one), else None."""
        if value in self.graph.constants:
            return self.graph.constants[value]
        node = self.producers.get(value)
        if node is not None and node.op in ("cast", "reshape", "expand", "identity") and node.inputs[0]:
            inner = self.const(node.inputs[0])
            if inner is not None:
                return ops.get(node.op).run([inner], node.attr)[0]
        return None

    def scalar(self, value: str) -> float | None:
        """The Python number held by a constant with one distinct value, else None."""
        t = self.const(value)
        if t is None or t.numel() == 0:
            return None
        flat = t.reshape(-1)
        if t.numel() > 1 and not bool((flat == flat[0]).all()):
            return None
        return float(flat[0])


def match(pattern: PatternLike, value: str, ctx: Context, caps: dict[str, Any] | None = None) -> dict | None:
    """Captures if ``value`` is produced as ``pattern`` describes, else None."""
    caps = {} if caps is None else caps
    if isinstance(pattern, str):
        if pattern in caps:
            return caps if caps[pattern] == value else None
        return {**caps, pattern: value}
    if isinstance(pattern, Opt):
        node = ctx.producers.get(value)
        if node is not None and node.op in ((pattern.op,) if isinstance(pattern.op, str) else pattern.op):
            got = match(pattern.inner, node.inputs[0], ctx, caps)
            if got is not None:
                return {**got, pattern.name: node} if pattern.name else got
        return match(pattern.inner, value, ctx, caps)
    if isinstance(pattern, Prod):
        return _match_prod(pattern, value, ctx, caps)
    if isinstance(pattern, Scalar):
        return match(pattern.name, value, ctx, caps) if ctx.scalar(value) is not None else None
    node = ctx.producers.get(value)
    if node is None or node.op not in pattern.ops():
        return None
    if any(node.attr.get(k) != v for k, v in pattern.attrs.items()):
        return None
    orders = [list(pattern.inputs)]
    if pattern.commutative and len(pattern.inputs) == 2:
        orders.append(list(reversed(pattern.inputs)))
    for subs in orders:
        got: dict | None = dict(caps)
        if len(subs) > len(node.inputs):
            continue
        for sub, inp in zip(subs, node.inputs):
            got = match(sub, inp, ctx, got) if inp else None
            if got is None:
                break
        if got is not None:
            return {**got, pattern.name: node} if pattern.name else got
    return None


def _factorings(value: str, ctx: Context, depth: int) -> list[list[str]]:
    """Every way to read ``value`` as a list of factors through nested ``mul`` nodes."""
    node = ctx.producers.get(value)
    out = [[value]]
    if depth > 0 and node is not None and node.op == "mul" and all(node.inputs[:2]):
        for a in _factorings(node.inputs[0], ctx, depth - 1):
            for b in _factorings(node.inputs[1], ctx, depth - 1):
                out.append(a + b)
    return out


def _match_prod(pattern: Prod, value: str, ctx: Context, caps: dict) -> dict | None:
    node = ctx.producers.get(value)
    if node is None or node.op != "mul":
        return None
    n = len(pattern.factors)
    for factors in _factorings(value, ctx, 3)[1:]:
        if len(factors) != n:
            continue
        for perm in itertools.permutations(factors):
            got: dict | None = dict(caps)
            for sub, v in zip(pattern.factors, perm):
                got = match(sub, v, ctx, got)
                if got is None:
                    break
            if got is not None:
                return {**got, pattern.name: node} if pattern.name else got
    return None


Rewrite = Callable[[dict, Context, "Emitter"], list[str]]


@dataclass(frozen=True)
class Pattern:
    """A named rewrite: ``root`` matched at a node's first output, ``check`` refuses with a reason,
    ``rewrite`` emits replacement nodes and returns the values that replace the root's outputs."""

    name: str
    root: Op
    rewrite: Rewrite
    check: Callable[[dict, Context], str | None] = lambda caps, ctx: None
    doc: str = ""
    # Whether a match is this pattern's to judge at all: one outside its scope (a ``where`` no softmax reads, for the
    # hidden-score patterns) is passed over without a refusal in the log, which ``explain`` shows.
    scope: Callable[[dict, Context], bool] = lambda caps, ctx: True


class Emitter:
    """Adds replacement nodes with inferred types and names unique in the graph being rewritten."""

    def __init__(self, taken: Iterable[str], types: dict[str, TensorType]):
        self._b = GraphBuilder("rewrite")
        self._b.reserve(taken)
        self._b.types.update(types)

    def add1(self, op: str, inputs: Iterable[str], **attrs: Any) -> str:
        return self._b.add1(op, inputs, **attrs)

    def constant(self, name: str, t: torch.Tensor) -> str:
        return self._b.constant(name, t)

    def type(self, value: str) -> TensorType:
        """The type of ``value``: a value of the graph or one added here."""
        return self._b.types[value]

    @property
    def nodes(self) -> list[Node]:
        return self._b.nodes

    @property
    def constants(self) -> dict[str, torch.Tensor]:
        return self._b.constants


@dataclass
class RewriteLog:
    """What each pattern did: applied matches and refusals with reasons."""

    applied: list[tuple[str, str]] = field(default_factory=list)  # (pattern, root node)
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # (pattern, root node, reason)


def rewrite(graph: Graph, patterns: list[Pattern], log: RewriteLog | None = None) -> Graph:
    """Apply ``patterns`` (priority order: the first that matches a node wins) until none applies."""
    log = RewriteLog() if log is None else log
    for _ in range(8):  # each round can expose new matches (e.g. rotary after GQA); a bound, no loop
        new = _rewrite_once(graph, patterns, log)
        if new is graph:
            return graph
        graph = new
    return graph


def _rewrite_once(graph: Graph, patterns: list[Pattern], log: RewriteLog) -> Graph:
    ctx = Context(graph)
    taken = set(ctx.values) | {n.name for n in graph.nodes}
    em = Emitter(taken, {k: v.type for k, v in ctx.values.items()})
    replace: dict[str, str] = {}
    inserted_after: dict[str, list[Node]] = {}
    consumed: set[str] = set()
    for node in reversed(graph.nodes):  # consumers first: the largest match wins
        if node.name in consumed or not node.outputs:
            continue
        for p in patterns:
            caps = match(p.root, node.outputs[0].name, ctx)
            if caps is None:
                continue
            matched = {v.name for v in caps.values() if isinstance(v, Node)}
            if matched & consumed or not p.scope(caps, ctx):
                continue
            reason = p.check(caps, ctx)
            if reason:
                log.refused.append((p.name, node.name, reason))
                continue
            start = len(em.nodes)
            outs = p.rewrite(caps, ctx, em)
            for old, new in zip(node.outputs, outs):
                if em.type(new) != old.type:
                    raise AssertionError(f"pattern {p.name} changed the type of {old.name}: "
                                         f"{old.type} -> {em.type(new)}")
                replace[old.name] = new
            inserted_after[node.name] = em.nodes[start:]
            consumed |= matched
            log.applied.append((p.name, node.name))
            break
    if not replace:
        return graph
    nodes: list[Node] = []
    for n in graph.nodes:
        nodes.append(n)
        nodes.extend(inserted_after.get(n.name, ()))
    nodes = [_rename_inputs(n, replace) for n in nodes]
    constants = {**graph.constants, **em.constants}
    outputs = tuple(replace.get(o, o) for o in graph.outputs)
    return eliminate_dead(toposort(graph.replace(nodes=tuple(nodes), constants=constants, outputs=outputs)))


def _rename_inputs(n: Node, replace: dict[str, str]) -> Node:
    if not any(i in replace for i in n.inputs):
        return n
    return Node(n.name, n.op, tuple(replace.get(i, i) for i in n.inputs), n.outputs, n.attrs)


def toposort(graph: Graph) -> Graph:
    """Order nodes so every value is defined before use, keeping the original order where possible."""
    prod = graph.producers()
    order: list[Node] = []
    state: dict[str, int] = {}
    by_name = {n.name: n for n in graph.nodes}

    def visit(n: Node) -> None:
        stack = [(n, False)]
        while stack:
            cur, done = stack.pop()
            if done:
                if state.get(cur.name) != 2:
                    state[cur.name] = 2
                    order.append(cur)
                continue
            if state.get(cur.name):
                continue
            state[cur.name] = 1
            stack.append((cur, True))
            for i in reversed(cur.inputs):
                p = prod.get(i)
                if p is not None and not state.get(p.name):
                    stack.append((by_name[p.name], False))

    for n in graph.nodes:
        visit(n)
    return graph.replace(nodes=tuple(order))


def eliminate_dead(graph: Graph) -> Graph:
    """Drop nodes whose outputs nobody reads, and constants nobody reads; verify the result."""
    return prune(graph).verify()

