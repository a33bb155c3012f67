#!/usr/bin/python3
"""Draws docs/speed/tiling.svg, the figure of docs/speed.md: the causal score matrix of one head in
64 × 64 tiles, what forward does along a tile of queries, and what backward does per tile."""
import os
n = 6            # tiles per side (T = 384)
s = 46           # pixels per tile
x0, y0 = 70, 60  # matrix origin
row = 3          # highlighted query tile
out = []
W, H = 760, 440
out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Arial, sans-serif" font-size="13">')
out.append('<rect width="100%" height="100%" fill="white"/>')
out.append('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#c8c8c8" stroke-width="2"/></pattern>'
           '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#b03a2e"/></marker></defs>')
out.append(f'<text x="10" y="{y0 - 34}" font-weight="bold">The scores of one head, queries × keys, in tiles of 64 × 64 (causal mask)</text>')
out.append(f'<text x="{x0 + n*s/2}" y="{y0 - 10}" text-anchor="middle">keys j →</text>')
out.append(f'<text x="{x0 - 14}" y="{y0 + n*s/2}" text-anchor="middle" transform="rotate(-90 {x0 - 14} {y0 + n*s/2})">queries i →</text>')
for i in range(n):
    for j in range(n):
        x, y = x0 + j*s, y0 + i*s
        if j > i:
            out.append(f'<rect x="{x}" y="{y}" width="{s}" height="{s}" fill="url(#hatch)" stroke="#999" stroke-width="0.5"/>')
        elif j == i:
            out.append(f'<rect x="{x}" y="{y}" width="{s}" height="{s}" fill="white" stroke="#999" stroke-width="0.5"/>')
            out.append(f'<path d="M{x},{y} L{x},{y+s} L{x+s},{y+s} z" fill="{"#5d8aa8" if i == row else "#a9c4d8"}"/>')
        else:
            out.append(f'<rect x="{x}" y="{y}" width="{s}" height="{s}" fill="{"#5d8aa8" if i == row else "#a9c4d8"}" stroke="#999" stroke-width="0.5"/>')
# arrow along the highlighted row
ya = y0 + row*s + s/2
out.append(f'<line x1="{x0 + 6}" y1="{ya}" x2="{x0 + (row+1)*s - 6}" y2="{ya}" stroke="#b03a2e" stroke-width="2.5" marker-end="url(#arrow)"/>')
out.append(f'<rect x="{x0}" y="{y0 + row*s}" width="{(row+1)*s}" height="{s}" fill="none" stroke="#b03a2e" stroke-width="2"/>')
# legend / text on the right
tx = x0 + n*s + 40
lines = [
    ("bold", "forward, one tile of 64 queries (red):"),
    ("", "for each tile of keys, left to right:"),
    ("", "  S = Q_i K_jᵀ (one 64 × 64 product)"),
    ("", "  m = max(m, row max of scale · S)"),
    ("", "  P = e^(scale · S − m), l = l · e^(m_old − m) + Σ P"),
    ("", "  O_i = O_i · e^(m_old − m) + P V_j"),
    ("", "then O_i = O_i / l; kept: O, m and 1 / l"),
    ("", ""),
    ("bold", "backward, per tile of keys j, per tile i below it:"),
    ("", "  P again = e^(scale · S − m) / l"),
    ("", "  dV_j += Pᵀ dO_i,  dS = P ⊙ (dP − D_i)"),
    ("", "  dQ_i += dS K_j,  dK_j += dSᵀ Q_i"),
    ("", "  (D = rowsum(dO ⊙ O), one number per query)"),
    ("", ""),
    ("swatch1", "computed tiles"),
    ("swatch2", "on the diagonal: keys past the query masked"),
    ("swatch3", "above the diagonal: skipped"),
]
y = y0 + 4
for kind, text in lines:
    if kind.startswith("swatch"):
        fill = {"swatch1": "#a9c4d8", "swatch2": "#a9c4d8", "swatch3": "url(#hatch)"}[kind]
        if kind == "swatch2":
            out.append(f'<rect x="{tx}" y="{y-11}" width="14" height="14" fill="white" stroke="#999" stroke-width="0.5"/>')
            out.append(f'<path d="M{tx},{y-11} L{tx},{y+3} L{tx+14},{y+3} z" fill="{fill}"/>')
        else:
            out.append(f'<rect x="{tx}" y="{y-11}" width="14" height="14" fill="{fill}" stroke="#999" stroke-width="0.5"/>')
        out.append(f'<text x="{tx + 22}" y="{y}">{text}</text>')
    elif text:
        weight = ' font-weight="bold"' if kind == "bold" else ""
        out.append(f'<text x="{tx}" y="{y}"{weight} xml:space="preserve">{text}</text>')
    y += 19
out.append(f'<text x="{x0}" y="{H - 14}">Memory kept per head: O (T × d) and 2 numbers per query, not the T × T weights.</text>')
out.append('</svg>')
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiling.svg"), "w").write("\n".join(out) + "\n")
