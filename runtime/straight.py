"""A run of a plan's regions as one straight-line Python function: what the runner calls once the plan is decided.

Note: interpreting a plan costs Python time per region and per node: a dict of values, a list of each region's
inputs, the registry's ``run`` and ``run_node`` around every torch call. On the CPU that is what separates a plan whose
regions all run through torch from eager (BERT at ``--size small``: 5.75 ms against eager's 4.62, issue #18). The
function built here does what ``PlanRunner._run_regions`` does, with locals for values, the torch-run regions' nodes
inlined as direct calls of their references, and a kernel region as one call of its function. Values are dropped
where the runner drops them (``del`` after the region that reads them last), so peak memory is unchanged. A failing
node raises the interpreter's ``ExecutionError`` naming it (``try`` costs nothing in CPython 3.11+ until it raises).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from tilefuse.ops.reference import ExecutionError, NodesFn

_SEQ = (tuple, list)


def _failed(node, inputs: Sequence, e: Exception) -> ExecutionError:
    shapes = [None if x is None else f"{x.dtype}{list(x.shape)}" for x in inputs]
    return ExecutionError(f"node {node.name!r} ({node.op}) failed on inputs {shapes}: {e}")


def straight_line(regions: Sequence, fns: Sequence[Callable], frees: Mapping[int, Sequence[str]], lo: int,
                  hi: int) -> Callable[[dict], None]:
    """``fn(env)`` running regions ``lo`` to ``hi - 1`` on the values in ``env``, as ``_run_regions`` does: it reads
    their inputs from ``env``, drops those read for the last time (``frees``: region index -> value names) and adds
    every value they make that is not dropped in the range."""
    glob: dict = {"_SEQ": _SEQ, "_failed": _failed, "_cpu": torch.device("cpu")}
    names: dict[str, str] = {}  # value name -> local
    lines: list[str] = []
    made: set[str] = set()
    freed: set[str] = set()
    outputs = {v for k in range(lo, hi) for v in regions[k].outputs}

    def local(v: str) -> str:
        if v not in names:
            names[v] = f"v{len(names)}"
            if v not in made:  # read from the caller's values
                freed_here = any(v in frees.get(k, ()) for k in range(lo, hi))
                lines.insert(0, f"    {names[v]} = env.{'pop' if freed_here else '__getitem__'}({v!r})")
        return names[v]

    def bind(obj, prefix: str) -> str:
        key = f"{prefix}{len(glob)}"
        glob[key] = obj
        return key

    for k in range(lo, hi):
        region, fn = regions[k], fns[k]
        ins = [local(v) for v in region.inputs]
        if isinstance(fn, NodesFn) and tuple(fn.inputs) == tuple(region.inputs) \
                and tuple(fn.outputs) == tuple(region.outputs):
            device = f"{ins[0]}.device" if ins else "_cpu"
            for node, spec, attrs in fn.steps:
                args = [local(i) if i else "None" for i in node.inputs]
                call = f"{bind(spec.ref, 'R')}({', '.join(args)}{', ' if args and attrs else ''}" \
                       f"{'**' + bind(dict(attrs), 'A') if attrs else ''})"
                outs = [v.name for v in node.outputs]
                for v in outs:
                    made.add(v)
                targets = [local(v) for v in outs]
                lines.append("    try:")
                lines.append(f"        _o = {call}")
                lines.append("    except Exception as e:")
                lines.append(f"        raise _failed({bind(node, 'N')}, [{', '.join(args)}], e) from e")
                lines.append("    if _o.__class__ not in _SEQ:")
                lines.append("        _o = (_o,)")
                if not node.inputs:  # a generator lands where the region's inputs are
                    lines.append(f"    _o = tuple(t.to({device}) for t in _o)")
                lines.append(f"    if len(_o) != {len(outs)}:")
                lines.append(f"        raise _failed({bind(node, 'N')}, [{', '.join(args)}], "
                             f"ValueError(f'returned {{len(_o)}} outputs, expected {len(outs)}'))")
                for j, t in enumerate(targets):
                    lines.append(f"    {t} = _o[{j}]")
            interior = [v for node, _, _ in fn.steps for v in (o.name for o in node.outputs)
                        if v not in region.outputs]
            if interior:  # (the interpreter's values die with its region)
                lines.append(f"    del {', '.join(dict.fromkeys(names[v] for v in interior))}")
                freed.update(interior)
        else:
            lines.append(f"    _o = {bind(fn, 'F')}([{', '.join(ins)}])")
            for v in region.outputs:
                made.add(v)
            for j, v in enumerate(region.outputs):
                lines.append(f"    {local(v)} = _o[{j}]")
        for v in frees.get(k, ()):
            if v in names:
                lines.append(f"    del {names[v]}")
                freed.add(v)
    lines.append("    _o = None")
    for v in sorted((made & outputs) - freed):
        lines.append(f"    env[{v!r}] = {names[v]}")
    src = "def run(env):\n" + "\n".join(lines) + "\n"
    code = compile(src, f"<tilefuse plan regions {lo}..{hi}>", "exec")
    exec(code, glob)  # noqa: S102 -- our own generated source, from the plan's names bound as globals
    run = glob["run"]
    run.source = src
    return run
