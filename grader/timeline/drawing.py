"""Decoded events kept (JSON), summed (``summarize``) and drawn (``draw_timeline``,
``draw_recorded``, ``draw``)."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from .decoding import Event, decode
from .records import KIND_COLORS


# ---------------------------------------------------------------------------------- keeping, summing
def events_to_json(events, path=None, **meta):
    """Events (and free-form metadata) -> JSON text; also written to ``path`` if given."""
    doc = {"meta": meta, "events": [e.as_dict() if isinstance(e, Event) else dict(e) for e in events]}
    text = json.dumps(doc, indent=None, separators=(",", ":"))
    if path is not None:
        with open(path, "w") as f:
            f.write(text)
    return text


def events_from_json(path):
    """(events, meta) from a file written by ``events_to_json``."""
    with open(path) as f:
        doc = json.load(f)
    return [Event(**d) for d in doc["events"]], doc.get("meta", {})


def summarize(events, ctas=None):
    """Per role: the time spent in each kind as a fraction of the role's lifetime (first start to
    last end), summed over the selected CTAs. Returns {role: {"span_us": ..., kind: fraction}}."""
    sel = _select(events, ctas, None)
    by_row = defaultdict(list)
    for e in sel:
        by_row[(e.cta, e.role)].append(e)
    out = defaultdict(lambda: defaultdict(float))
    for (cta, role), evs in by_row.items():
        span = max(e.end_ns for e in evs) - min(e.start_ns for e in evs)
        out[role]["span_us"] += span / 1e3
        for e in evs:
            out[role][e.kind] += e.dur_ns / 1e3
    res = {}
    for role, d in out.items():
        span = d["span_us"]
        res[role] = {"span_us": round(span, 3), **{k: round(v / span, 4) if span else 0.0
                                                  for k, v in d.items() if k != "span_us"}}
    return res


# ---------------------------------------------------------------------------------- drawing
def _select(events, ctas, window_us):
    if ctas is not None:
        ctas = {ctas} if isinstance(ctas, (int, np.integer)) else set(ctas)
    out = []
    for e in events:
        e = e if isinstance(e, Event) else Event(**e)
        if ctas is not None and e.cta not in ctas:
            continue
        if window_us is not None:
            lo, hi = window_us[0] * 1e3, window_us[1] * 1e3
            if e.end_ns < lo or e.start_ns > hi:
                continue
        out.append(e)
    return out


def draw_timeline(events, ax=None, title=None, *, ctas=None, window_us=None, kinds=None,
                  roles=None, row_by="cta", sms=None, max_rows=64, row_height=0.8,
                  min_width_us=0.0, max_labels=48, legend=True):
    """Draw events as a timeline: one row per (CTA, role), top to bottom in CTA and group order,
    one box per event coloured by kind, time in microseconds.

    ctas      : an int or a list: only these CTAs (default: all, at most ``max_rows`` rows).
    window_us : (t0, t1): only this time window (µs from the launch's first record).
    kinds     : only these kinds (default: all).
    roles     : only these roles (row names), e.g. one consumer warp per CTA for an overview.
    row_by    : "cta" (default) or "sm": one row per (SM, role), so that the CTAs an SM ran one
                after another share a row (needs the SM id, recorded by default).
    sms       : with row_by="sm": only these SMs.
    max_rows  : draw at most this many rows (the first ones); beyond ``max_labels`` rows only
                every n-th row is labelled.
    min_width_us : draw every box at least this wide, so that very short events stay visible.
    legend    : draw the legend of the kinds (right of the axes).
    Returns the matplotlib Axes; ``ax._timeline_rows`` lists the row labels (top first) and
    ``ax._timeline_boxes`` counts the boxes drawn.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sel = _select(events, ctas, window_us)
    if kinds is not None:
        sel = [e for e in sel if e.kind in set(kinds)]
    if roles is not None:
        roles = {roles} if isinstance(roles, str) else set(roles)
        sel = [e for e in sel if e.role in roles]
    if row_by not in ("cta", "sm"):
        raise ValueError("row_by must be 'cta' or 'sm'")
    sm_of_cta = {e.cta: e.sm for e in sel}
    if row_by == "sm":
        if sms is not None:
            sms = {sms} if isinstance(sms, (int, np.integer)) else set(sms)
            sel = [e for e in sel if e.sm in sms]
        # CTAs resident on one SM at the same time get separate slots (sub-rows), greedily by start
        life = {}
        for e in sel:
            lo, hi = life.get(e.cta, (e.start_ns, e.end_ns))
            life[e.cta] = (min(lo, e.start_ns), max(hi, e.end_ns))
        slot_of, busy = {}, defaultdict(list)          # busy[sm][slot] = end of its last CTA
        for cta in sorted(life, key=lambda c: life[c][0]):
            sm, (lo, hi) = sm_of_cta[cta], life[cta]
            ends = busy[sm]
            slot = next((i for i, t in enumerate(ends) if t <= lo), len(ends))
            if slot == len(ends):
                ends.append(hi)
            else:
                ends[slot] = hi
            slot_of[cta] = slot

        def unit(e):
            return (e.sm, slot_of[e.cta])

        def name(u):
            return f"SM {u[0]}" + (f".{u[1]}" if u[1] else "")
    else:
        def unit(e):
            return e.cta

        def name(u):
            sm = sm_of_cta.get(u, -1)
            return f"CTA {u}" + (f" @SM {sm}" if sm >= 0 else "")
    rows = sorted({(unit(e), e.group, e.role) for e in sel})
    if len(rows) > max_rows:
        rows = rows[:max_rows]
    row_of = {(c, g): i for i, (c, g, _) in enumerate(rows)}
    if ax is None:
        _, ax = plt.subplots(figsize=(14, 1.0 + 0.32 * max(len(rows), 1)))

    boxes = defaultdict(list)
    for e in sel:
        i = row_of.get((unit(e), e.group))
        if i is None:
            continue
        x0, w = e.start_ns / 1e3, max(e.dur_ns / 1e3, min_width_us)
        if window_us is not None:                      # clip to the window
            x1 = min(x0 + w, window_us[1])
            x0 = max(x0, window_us[0])
            w = max(x1 - x0, min_width_us)
        boxes[(i, e.kind)].append((x0, w))
    nbox = 0
    for (i, kind), spans in boxes.items():
        y = len(rows) - 1 - i                          # the first row on top
        ax.broken_barh(spans, (y - row_height / 2, row_height),
                       facecolors=KIND_COLORS.get(kind, "#444444"), edgecolors="none")
        nbox += len(spans)

    labels = [f"{name(c)} · {r}" for c, _, r in rows]
    every = max(1, -(-len(rows) // max_labels))
    ax.set_yticks([len(rows) - 1 - i for i in range(0, len(rows), every)])
    ax.set_yticklabels([labels[i] for i in range(0, len(rows), every)], fontsize=8 if every == 1 else 6)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("time (µs)")
    if window_us is not None:
        ax.set_xlim(*window_us)
    if legend:
        present = [k for k in KIND_COLORS if any(k == kk for _, kk in boxes)]
        present += sorted({kk for _, kk in boxes} - set(present))
        ax.legend(handles=[Patch(color=KIND_COLORS.get(k, "#444444"), label=k) for k in present],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    ax._timeline_rows = labels
    ax._timeline_boxes = nbox
    return ax


def draw_recorded(events, meta: dict, path, *, zoom_us, overview_title: str, zoom_title: str, heading: str):
    """A recorded reference timeline as the lectures show it: every kept CTA on top, a window of
    the first one below (``zoom_us``), and a heading followed by where it was measured and, if
    ``meta`` has them, the untraced and traced times. Saved to ``path``."""
    import matplotlib.pyplot as plt
    ctas = sorted({e.cta for e in events})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12.5, 6.8), dpi=110, gridspec_kw={"height_ratios": [1.5, 1]})
    draw_timeline(events, ax=top, ctas=ctas, min_width_us=0.004, title=overview_title)
    draw_timeline(events, ax=bottom, ctas=ctas[0], window_us=zoom_us, min_width_us=0.004, title=zoom_title)
    where = str(meta.get("device", "H200")).split(",")[0].replace("NVIDIA ", "")
    if meta.get("untraced_ms") and meta.get("traced_ms"):
        where += f"; untraced {meta['untraced_ms']:.3f} ms, traced {meta['traced_ms']:.3f} ms"
    fig.suptitle(f"{heading}, {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _is_events(trace) -> bool:
    return isinstance(trace, (list, tuple)) and (not trace or isinstance(trace[0], (Event, dict)))


def draw(trace, group_names=None, path=None, *, title=None, clock_ghz=None, **kwargs):
    """Trace -> figure, in one call. ``trace`` is the trace buffer after the launch (decoded here
    with ``group_names``) or a list of events; ``path``, if given, is where the PNG is written.
    Other keyword arguments go to ``draw_timeline`` (``ctas=[0, 1]``, ``window_us=(0, 10)``, ...).
    Returns the matplotlib Figure (close it with ``matplotlib.pyplot.close`` in a loop)."""
    events = list(trace) if _is_events(trace) else decode(trace, group_names, clock_ghz=clock_ghz)
    ax = draw_timeline(events, title=title, **kwargs)
    fig = ax.figure
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig
