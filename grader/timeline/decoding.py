"""The host side of the record format: a trace buffer to ``Event``s (``decode``, with a
``TraceInfo``) and back (``encode``, the device's writing done on the host)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from .records import (ANCHOR_CLOCK, ANCHOR_GLOBAL, BEGIN, END, FINALIZE, INSTANT, KIND_NAMES, SMID,
                      STAGE_BITS, buffer_len, kind_code)


# ---------------------------------------------------------------------------------- decoding
@dataclasses.dataclass(slots=True)
class Event:
    cta: int          # linear CTA index (blockIdx.z * gy + blockIdx.y) * gx + blockIdx.x
    group: int        # row within the CTA (the ``group`` passed to Tracer.init)
    role: str         # group_names[group], or "group<g>"
    kind: str         # "wait", "load", "mma", ...
    start_ns: float   # from the earliest record of the launch
    end_ns: float
    tile: int         # occurrence of this kind in this row: 0, 1, 2, ... (the K tile, for
                      # regions traced once per K tile)
    stage: int        # the stage passed to begin/end
    sm: int = -1      # the SM the CTA ran on (-1: not recorded)

    @property
    def dur_ns(self) -> float:
        return self.end_ns - self.start_ns

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TraceInfo:
    num_ctas: int
    num_groups: int
    stamp: str                     # "globaltimer" or "clock"
    clock_ghz: float | None        # clock mode: the rate used to convert cycles to ns
    clock_ghz_source: str | None   # "anchors" (estimated), "given", or "assumed ..."
    records: int                   # records read
    truncated_groups: int          # groups with records but no finalize (buffer full, no finalize)
    unmatched: int                 # a begin without an end or an end without a begin
    bad_tags: int                  # records whose group field disagrees with their slot


def _as_u64(buffer) -> np.ndarray:
    if hasattr(buffer, "detach"):                     # torch tensor (any device, int64 or uint64)
        import torch
        t = buffer.detach().cpu()
        if t.dtype != torch.int64 and t.dtype != getattr(torch, "uint64", None):
            raise TypeError(f"trace buffer must be 64-bit, got {t.dtype}")
        arr = t.view(torch.int64).numpy()
    elif hasattr(buffer, "numpy") and not isinstance(buffer, np.ndarray):   # TVM tensor
        arr = buffer.numpy()
    else:
        arr = np.asarray(buffer)
    if arr.dtype.itemsize != 8:
        raise TypeError(f"trace buffer must be 64-bit, got {arr.dtype}")
    return arr.reshape(-1).view(np.uint64)


def _unwrap32(stamps: np.ndarray) -> np.ndarray:
    """The 32-bit stamps of one row (non-decreasing in time) -> int64, without wraps."""
    s = stamps.astype(np.int64)
    if s.size < 2:
        return s
    d = np.diff(s) % (1 << 32)
    return np.concatenate([s[:1], s[0] + np.cumsum(d)])


def _signed32(x):
    x = int(x) % (1 << 32)
    return x - (1 << 32) if x >= (1 << 31) else x


def _pair_row_loop(g, ev, ty, t, ng, names, sm):
    """Begin/end matching of one row in Python (any nesting): the fallback of ``_pair``."""
    cta, grp = divmod(g, ng)
    role = names[grp] if grp < len(names) else f"group{grp}"
    out, unmatched = [], 0
    open_, seq = defaultdict(list), defaultdict(int)
    for e, y, ti in zip(ev.tolist(), ty.tolist(), np.asarray(t, dtype=np.float64).tolist()):
        kc = e & 0xF
        if kc >= SMID:
            continue
        if y == BEGIN:
            open_[e].append((ti, seq[kc]))
            seq[kc] += 1
        elif y == END:
            if not open_[e]:
                unmatched += 1
                continue
            t0, n = open_[e].pop()
            out.append(Event(cta, grp, role, KIND_NAMES.get(kc, f"kind{kc}"), t0, ti, n, e >> 4, sm))
        elif y == INSTANT:
            out.append(Event(cta, grp, role, KIND_NAMES.get(kc, f"kind{kc}"), ti, ti, seq[kc], e >> 4, sm))
            seq[kc] += 1
    return out, unmatched + sum(len(v) for v in open_.values())


def _pair(rows, t_rows, ng, names, sm_of):
    """Begin/end matching of all rows at once (NumPy). A row in which some event code is not a
    clean begin, end, begin, end, ... sequence goes through ``_pair_row_loop`` instead."""
    gs = [g for g in rows if g in t_rows]
    if not gs:
        return [], 0
    lens = [len(rows[g][1]) for g in gs]
    row = np.repeat(np.array(gs, dtype=np.int64), lens)
    pos = np.concatenate([np.arange(n) for n in lens])
    ev = np.concatenate([rows[g][1] for g in gs]).astype(np.int64)
    ty = np.concatenate([rows[g][2] for g in gs]).astype(np.int64)
    t = np.concatenate([np.asarray(t_rows[g], dtype=np.float64) for g in gs])
    keep = ((ev & 0xF) < SMID) & (ty != FINALIZE)
    row, pos, ev, ty, t = row[keep], pos[keep], ev[keep], ty[keep], t[keep]
    kc = ev & 0xF
    # occurrence index per (row, kind) over begins and instants, in record order
    bi = np.flatnonzero((ty == BEGIN) | (ty == INSTANT))
    o = bi[np.lexsort((pos[bi], kc[bi], row[bi]))]
    key = row[o] * 16 + kc[o]
    start = np.r_[True, key[1:] != key[:-1]]
    grp_first = np.maximum.accumulate(np.where(start, np.arange(o.size), 0))
    occ = np.zeros(ev.size, dtype=np.int64)
    occ[o] = np.arange(o.size) - grp_first
    # begins and ends: per (row, event code) the types must read 0, 1, 0, 1, ...
    be = np.flatnonzero(ty != INSTANT)
    o = be[np.lexsort((pos[be], ev[be], row[be]))]
    key = row[o] * 1024 + ev[o]
    start = np.r_[True, key[1:] != key[:-1]]
    first = np.maximum.accumulate(np.where(start, np.arange(o.size), 0))
    expect = (np.arange(o.size) - first) % 2
    last = np.r_[key[1:] != key[:-1], True]
    bad_el = (ty[o] != expect) | (last & (expect == 0))        # out of order, or a final begin
    bad_rows = set(np.unique(row[o][bad_el]).tolist())
    good = ~np.isin(row[o], list(bad_rows)) if bad_rows else np.ones(o.size, dtype=bool)
    og = o[good]
    b_idx, e_idx = og[0::2], og[1::2]
    inst = np.flatnonzero(ty == INSTANT)
    if bad_rows:
        inst = inst[~np.isin(row[inst], list(bad_rows))]
    events = []
    name_of = [names[i] if i < len(names) else f"group{i}" for i in range(ng)]
    kind_of = [KIND_NAMES.get(k, f"kind{k}") for k in range(16)]
    top = int(row.max()) + 1 if row.size else 1
    sm_arr = np.full(top, -1, dtype=np.int64)
    for g in range(top):
        sm_arr[g] = sm_of.get(g, sm_of.get((g // ng) * ng, -1))
    for idx_s, idx_e in ((b_idx, e_idx), (inst, inst)):
        r = row[idx_s]
        cols = zip((r // ng).tolist(), (r % ng).tolist(), t[idx_s].tolist(), t[idx_e].tolist(),
                   kc[idx_s].tolist(), (ev[idx_s] >> 4).tolist(), occ[idx_s].tolist(), sm_arr[r].tolist())
        events += [Event(c, g, name_of[g], kind_of[k], a, b, n, stg, m) for c, g, a, b, k, stg, n, m in cols]
    unmatched = 0
    for g in sorted(bad_rows):
        evs, un = _pair_row_loop(g, rows[g][1], rows[g][2], t_rows[g], ng, names,
                                 sm_of.get(g, sm_of.get((g // ng) * ng, -1)))
        events += evs
        unmatched += un
    return events, unmatched


def decode(buffer, group_names=None, *, clock_ghz: float | None = None, num_ctas=None,
           num_groups=None, return_info=False):
    """Trace buffer -> list of ``Event``, sorted by CTA, group and start time.

    buffer      : the buffer after the launch: a TVM tensor, a torch tensor or a NumPy array.
    group_names : row names, ``group_names[g]`` for group g (default "group<g>").
    clock_ghz   : clock mode only: the SM clock in GHz (default: estimated from the anchors).
    num_ctas, num_groups : only needed when the header is missing (thread 0 of CTA 0 never ran
                  ``init``).
    return_info : also return a ``TraceInfo`` (truncated rows, unmatched records, ...).
    """
    arr = _as_u64(buffer)
    head = int(arr[0])
    nb = num_ctas if num_ctas is not None else head & 0xFFFFFFFF
    ng = num_groups if num_groups is not None else head >> 32
    if nb <= 0 or ng <= 0:
        raise ValueError("trace buffer has no header (was the kernel run with tracing enabled?)")
    stride = nb * ng
    names = list(group_names) if group_names is not None else []

    rows = {}                  # global group -> (stamps, events, types), up to the finalize record
    sm_of = {}                 # global group -> SM id
    truncated = bad = nrec = 0
    for g in range(stride):
        recs = arr[1 + g::stride]
        nz = np.flatnonzero(recs == 0)
        recs = recs[: nz[0]] if nz.size else recs
        if recs.size == 0:
            continue
        tags = (recs & np.uint64(0xFFFFFFFF)).astype(np.int64)
        typ = tags & 3
        fin = np.flatnonzero(typ == FINALIZE)
        if fin.size:
            recs, tags, typ = recs[: fin[0]], tags[: fin[0]], typ[: fin[0]]
        else:
            truncated += 1
        ok = (tags >> 12) == g
        bad += int((~ok).sum())
        recs, tags, typ = recs[ok], tags[ok], typ[ok]
        nrec += int(recs.size)
        evt = (tags >> 2) & 0x3FF
        is_sm = ((evt & 0xF) == SMID) & (typ == INSTANT)
        if is_sm.any():
            sm_of[g] = int(recs[is_sm][0] >> np.uint64(32))
            recs, evt, typ = recs[~is_sm], evt[~is_sm], typ[~is_sm]
        if recs.size:
            rows[g] = ((recs >> np.uint64(32)).astype(np.int64), evt, typ)

    clock_mode = any(np.any((ev & 0xF) >= ANCHOR_CLOCK) for _, ev, _ in rows.values())
    # All times on one axis: unwrap each row, then place it relative to a common reference.
    t_rows = {}
    ghz, ghz_src = None, None
    if not clock_mode:
        ref = None
        for g, (st, ev, ty) in rows.items():
            u = _unwrap32(st)
            if ref is None:
                ref = int(st[0])
            t_rows[g] = (u - u[0] + _signed32(int(st[0]) - ref)).astype(np.float64)
    else:
        anchors = {}
        for g, (st, ev, ty) in rows.items():
            k = ev & 0xF
            clk = _unwrap32(st[k != ANCHOR_GLOBAL])           # every other stamp is a clock
            gts = st[k == ANCHOR_GLOBAL]
            anchors[g] = (clk, k[k != ANCHOR_GLOBAL], gts)
        if clock_ghz is None:
            # pooled over rows: cycles / ns between each row's first and last anchor (the
            # globaltimer may tick only every microsecond; pooling averages that out)
            dc = dg = 0
            for clk, k, gts in anchors.values():
                ac = clk[k == ANCHOR_CLOCK]
                if ac.size >= 2 and gts.size >= 2:
                    dc += int(ac[-1] - ac[0])
                    dg += (int(gts[-1]) - int(gts[0])) % (1 << 32)
            if dg > 2000:
                ghz, ghz_src = dc / dg, "anchors"
            else:
                ghz, ghz_src = 1.98, "assumed (H200 boost clock; too little anchor time)"
        else:
            ghz, ghz_src = float(clock_ghz), "given"
        # The rows of a CTA read the same SM counter: one cycles -> ns map per CTA, whose offset
        # is the mean over all anchor pairs of the CTA (one pair alone is off by up to a tick).
        g_ref = None
        by_cta = defaultdict(list)
        for g in sorted(anchors):
            by_cta[g // ng].append(g)
        for cta, gs in by_cta.items():
            c_first = int(rows[gs[0]][0][0])                   # raw first stamp of the first row
            rel, samples = {}, []
            for g in gs:
                clk, k, gts = anchors[g]
                raw0 = int(rows[g][0][0])
                rel[g] = clk - clk[0] + _signed32(raw0 - c_first)   # cycles since c_first
                ac = rel[g][k == ANCHOR_CLOCK]
                for c, gt in zip(ac, gts):
                    if g_ref is None:
                        g_ref = int(gt)
                    samples.append(_signed32(int(gt) - g_ref) - c / ghz)
            if not samples:
                continue
            off = float(np.mean(samples))
            for g in gs:
                t_rows[g] = off + rel[g] / ghz
        # keep the non-anchor records, aligned with t_rows
        for g in list(rows):
            st, ev, ty = rows[g]
            keep = (ev & 0xF) != ANCHOR_GLOBAL
            rows[g] = (st[keep], ev[keep], ty[keep])
            if g not in t_rows:
                rows.pop(g)

    events, unmatched = _pair(rows, t_rows, ng, names, sm_of)
    if events:
        t0 = min(e.start_ns for e in events)
        for e in events:
            e.start_ns -= t0
            e.end_ns -= t0
    events.sort(key=lambda e: (e.cta, e.group, e.start_ns, e.end_ns))
    if return_info:
        return events, TraceInfo(nb, ng, "clock" if clock_mode else "globaltimer", ghz, ghz_src,
                                 nrec, truncated, unmatched, bad)
    return events


def encode(events, num_ctas: int, num_groups: int, max_records: int, *, stamp="globaltimer",
           clock_ghz=1.98, base=(1 << 32) - 3000, finalize=True):
    """The inverse of ``decode``: write ``events`` (Event or dict, times in ns) into a buffer the
    way the device does (header, interleaved slots, tags, 32-bit stamps that may wrap). ``base`` is
    the globaltimer_lo value of time 0 (the default makes the stamps wrap). Within a row the
    records are written in time order: a begin at its start, an end at its end."""
    buf = np.zeros(buffer_len(num_ctas, num_groups, max_records), dtype=np.uint64)
    buf[0] = np.uint64((num_groups << 32) | num_ctas)
    stride = num_ctas * num_groups
    per_row = defaultdict(list)
    sm_row = {}
    for e in events:
        e = e if isinstance(e, dict) else e.as_dict()
        if e.get("sm", -1) >= 0:
            sm_row[e["cta"] * num_groups + e["group"]] = e["sm"]
        code = (e["stage"] % (1 << STAGE_BITS)) << 4 | kind_code(e["kind"])
        g = e["cta"] * num_groups + e["group"]
        if e["end_ns"] == e["start_ns"] and e.get("instant", False):
            per_row[g].append((e["start_ns"], 1, code, INSTANT))
        else:
            per_row[g].append((e["start_ns"], 1, code, BEGIN))
            per_row[g].append((e["end_ns"], 0, code, END))   # at a tie an end sorts before a begin
    for g, recs in per_row.items():
        recs.sort(key=lambda r: (r[0], r[1]))
        t_first, t_last = recs[0][0], recs[-1][0]
        out = []
        sm = sm_row.get(g, -1)
        if sm >= 0:
            out.append((sm, SMID << 2 | INSTANT))
        if stamp == "clock":
            c_base = 123_456_789 + 7919 * (g // num_groups)  # one counter per CTA (SM)

            def clk(t):
                return int(round(c_base + t * clock_ghz)) % (1 << 32)
            out.append((clk(t_first), ANCHOR_CLOCK << 2 | INSTANT))
            out.append((int(round(base + t_first)) % (1 << 32), ANCHOR_GLOBAL << 2 | INSTANT))
            out += [(clk(t), c << 2 | y) for t, _, c, y in recs]
            out.append((clk(t_last), ANCHOR_CLOCK << 2 | INSTANT))
            out.append((int(round(base + t_last)) % (1 << 32), ANCHOR_GLOBAL << 2 | INSTANT))
        else:
            out += [(int(round(base + t)) % (1 << 32), c << 2 | y) for t, _, c, y in recs]
        if finalize:
            out.append((int(round(base + t_last)) % (1 << 32), FINALIZE))
        if len(out) > max_records:
            raise ValueError(f"row {g} needs {len(out)} records > max_records={max_records}")
        for i, (s, bits) in enumerate(out):
            buf[1 + g + i * stride] = np.uint64((s << 32) | (g << 12) | bits)
    return buf
