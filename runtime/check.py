"""Region-by-region numerics: run each lowered region's kernel and its reference on the same inputs."""

from __future__ import annotations

import torch

from tilefuse.runtime.plan_runner import PlanRunner


def compare_regions(runner: PlanRunner, *args: torch.Tensor) -> list[tuple[str, float]]:
    """(region name, max relative error of its kernel against its nodes' references) per lowered
    region, feeding every region the reference values so errors do not compound."""
    ref = PlanRunner(runner.plan, {}, check=False)
    g = runner.plan.graph
    env = dict(ref.constants(args[0].device if args else torch.device("cpu")))
    env.update({v.name: a for v, a in zip(g.inputs, args)})
    report = []
    for region, fn_ref in zip(ref.plan.regions, ref.fns):
        ins = [env[i] for i in region.inputs]
        want = fn_ref(ins)
        kernel = runner.kernels.get(region.name)
        if kernel is not None:
            got = kernel(ins)
            bad = [(tuple(a.shape), tuple(b.shape)) for a, b in zip(got, want) if a.shape != b.shape]
            if bad:
                report.append((region.name, float("inf")))
                print(f"{region.name}: kernel output shapes differ from the reference: {bad}")
                env.update(zip(region.outputs, want))
                continue
            err = max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))
                      for a, b in zip(got, want))
            report.append((region.name, err))
        env.update(zip(region.outputs, want))
    return report
