"""Draw a FusionPlan as SVG (or an HTML page around it): graph nodes laid out in topological
layers, each region a coloured group (a shaded box behind its nodes), kinds in the legend."""

from __future__ import annotations

import colorsys
import html

import networkx as nx

from tilefuse.planner.plan import FusionPlan

KIND_HUE = {"gemm": 0.58, "gemm_sp": 0.66, "attention": 0.8, "reduction": 0.1, "elementwise": 0.33,
            "opaque": 0.0, "view": 0.0}
W, H, DX, DY = 150, 30, 175, 56


def _color(kind: str, k: int, light: bool) -> str:
    sat = 0.0 if kind in ("opaque", "view") else (0.25 if light else 0.55)
    val = 0.97 if light else (0.85 - 0.12 * (k % 3))
    r, g, b = colorsys.hsv_to_rgb(KIND_HUE.get(kind, 0.0), sat, val)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def to_svg(plan: FusionPlan) -> str:
    dag = plan.graph.to_networkx()
    layers = list(nx.topological_generations(dag))
    pos = {}
    for y, layer in enumerate(layers):
        for x, n in enumerate(sorted(layer)):
            pos[n] = (20 + x * DX, 60 + y * DY)
    width = max([p[0] for p in pos.values()] + [600]) + W + 40
    height = max([p[1] for p in pos.values()] + [100]) + H + 40
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
            f'font-size="11">'),
           f'<text x="20" y="24" font-size="14">{html.escape(plan.summary())}</text>']
    x0 = 20
    for kind in ("gemm", "attention", "reduction", "elementwise", "opaque"):
        out.append(f'<rect x="{x0}" y="34" width="12" height="12" fill="{_color(kind, 0, False)}"/>'
                   f'<text x="{x0 + 16}" y="44">{kind}</text>')
        x0 += 110
    region_of = plan.region_of()
    for k, r in enumerate(plan.regions):  # region groups behind the nodes
        pts = [pos[n] for n in r.nodes if n in pos]
        if not pts or r.kind == "view":
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        out.append(f'<rect x="{min(xs) - 6}" y="{min(ys) - 6}" width="{max(xs) - min(xs) + W + 12}" '
                   f'height="{max(ys) - min(ys) + H + 12}" rx="8" fill="{_color(r.kind, k, True)}" '
                   f'stroke="{_color(r.kind, k, False)}" stroke-width="2" fill-opacity="0.6">'
                   f'<title>{html.escape(r.name)} ({r.kind}, {r.backend})</title></rect>')
    for a, b in dag.edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        out.append(f'<line x1="{xa + W / 2}" y1="{ya + H}" x2="{xb + W / 2}" y2="{yb}" stroke="#888" '
                   f'stroke-width="1"/>')
    for k, n in enumerate(plan.graph.nodes):
        x, y = pos[n.name]
        r = region_of.get(n.name)
        kind = r.kind if r else "opaque"
        rk = plan.regions.index(r) if r else 0
        title = f"{n.name}: {n.op} -> {', '.join(str(o.type) for o in n.outputs)}; region {r.name if r else '-'}"
        out.append(f'<g><title>{html.escape(title)}</title>'
                   f'<rect x="{x}" y="{y}" width="{W}" height="{H}" rx="4" fill="{_color(kind, rk, False)}" '
                   f'stroke="#333"/><text x="{x + 6}" y="{y + 19}">{html.escape(n.op[:20])}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def to_html(plan: FusionPlan) -> str:
    rows = "".join(f"<tr><td>{html.escape(r.name)}</td><td>{r.kind}</td><td>{r.backend}</td>"
                   f"<td>{html.escape(' '.join(r.ops))}</td></tr>" for r in plan.regions if r.kind != "view")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(plan.graph.name)}</title>"
            f"</head><body><h3>{html.escape(plan.summary())}</h3>{to_svg(plan)}"
            f"<table border='1' cellpadding='3'><tr><th>region</th><th>kind</th><th>backend</th><th>ops</th></tr>"
            f"{rows}</table></body></html>")
