"""Pipeline timelines for TIRx kernels: trace points inside a kernel, a decoder, a drawing.

Three parts, usable separately:

(a) ``Tracer``: device-side trace points for a ``@T.prim_func``. It is a thin wrapper over the
    in-kernel profiler that apache-tvm 0.26 ships (``T.cuda.timer_init / timer_start / timer_end
    / timer_finalize``, the FlashInfer-style profiler that ``tvm.tirx.bench.CudaProfiler`` also
    wraps). One fixed *leader* thread per *group* (a group is one timeline row inside a CTA: the
    TMA producer warp, one consumer warp, ...) writes 64-bit records into a ``uint64`` buffer
    that the host passes in as a kernel argument::

        tr = Tracer(prof, num_groups=5, num_ctas=NUM_CTAS, leader=(lane_id == 0))  # kernel body
        tr.init(group_id)                                    # every thread, once
        tr.begin("wait", stage); T.ptx.mbarrier.try_wait(full.ptr_to([stage]), phase); tr.end("wait", stage)
        ...
        tr.finalize()                                        # every leader, at the end

(b) ``decode(buffer, group_names=...)``: pure Python/NumPy; turns the buffer (a torch tensor, a
    TVM tensor's ``.numpy()`` or a NumPy array) into a list of
    ``Event(cta, group, role, kind, start_ns, end_ns, tile, stage, sm)``.
    ``encode(...)`` is its inverse (it writes records exactly as the device does), for tests.

(c) ``draw_timeline(events, ...)``: matplotlib, one row per (CTA, role) or per (SM, role), a box
    per event coloured by kind, time in microseconds; optionally some CTAs, roles, a time window.

Record format (the library's; see ``tvm/backend/cuda/intrinsics/misc.py``)::

    buffer[0]            = (num_groups << 32) | num_ctas          written by thread 0 of CTA 0
    buffer[1 + g + i*S]  = i-th record of global group g = cta * num_groups + group,
                           S = num_ctas * num_groups (records of all groups are interleaved)
    record               = (stamp32 << 32) | (g << 12) | (event << 2) | type
                           type: 0 begin, 1 end, 2 instant, 3 finalize (the row's last record)
                           event (10 bits, this module's convention): kind | stage << 4

stamp32 is ``%globaltimer_lo`` (ns, shared by all SMs) with ``stamp="globaltimer"`` (the library's
own intrinsics), or ``%clock`` (SM cycles, exact but per SM) with ``stamp="clock"``. In clock
mode the tracer also writes two *anchor* instants (one ``%clock``, one ``%globaltimer_lo``) at
``init`` and at ``finalize``; the decoder uses them to put every CTA on the common globaltimer
axis and to estimate the SM clock rate. With ``record_sm`` (default) ``init`` also writes one
instant of kind 13 whose stamp field holds ``%smid``. (TVM's own
``tvm.tirx.bench.export_to_perfetto_trace`` reads the same layout; give it ``record_sm=False``
traces and an event-name list indexed by ``kind | stage << 4``.)
"""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

import numpy as np

# ----------------------------------------------------------------------------------------------
# Event kinds: 4 bits of the 10-bit event field. 13 (the SM id record) and 14, 15 (the clock
# anchors) are reserved.
# ----------------------------------------------------------------------------------------------
KINDS = {
    "wait": 0,       # blocked on a barrier (mbarrier try_wait, named barrier): a bubble
    "load": 1,       # issuing TMA loads (the copy itself is asynchronous)
    "mma": 2,        # issuing wgmma / tcgen05 and waiting for them
    "epilogue": 3,   # accumulator registers -> shared memory (convert, store)
    "store": 4,      # TMA store of the output tile (issue + wait)
    "sync": 5,       # CTA-wide or warpgroup barrier (bar.sync)
    "setup": 6,      # barrier init, descriptor prefetch, ...
    "other": 7,
}
SMID, ANCHOR_CLOCK, ANCHOR_GLOBAL = 13, 14, 15     # reserved: not time events
KIND_NAMES = {v: k for k, v in KINDS.items()}
KIND_COLORS = {
    "wait": "#d62728",      # red: time lost
    "load": "#1f77b4",      # blue
    "mma": "#2ca02c",       # green: useful work
    "epilogue": "#ff7f0e",  # orange
    "store": "#9467bd",     # purple
    "sync": "#bcbd22",      # olive
    "setup": "#7f7f7f",     # grey
    "other": "#17becf",
}
BEGIN, END, INSTANT, FINALIZE = 0, 1, 2, 3
STAGE_BITS = 6                       # stage index 0..63 rides along in the event field


def kind_code(kind) -> int:
    """Kind name or number -> 4-bit code."""
    if isinstance(kind, str):
        if kind not in KINDS:
            raise ValueError(f"unknown trace kind {kind!r}; known: {sorted(KINDS)} (or pass 0..12)")
        return KINDS[kind]
    code = int(kind)
    if not 0 <= code < SMID:
        raise ValueError(f"trace kind code must be in 0..12, got {code}")
    return code


def buffer_len(num_ctas: int, num_groups: int, max_records: int) -> int:
    """Length of the uint64 trace buffer for ``max_records`` records per group (count a begin and
    an end as two; add 1 for the finalize record, 1 for the SM id, and 4 anchors in clock mode)."""
    return 1 + num_ctas * num_groups * max_records


# ----------------------------------------------------------------------------------------------
# (a) device side
# ----------------------------------------------------------------------------------------------
# clock mode: one record stamped with the SM's cycle counter. fence: 0 = fence after the record
# (a begin, as the library's timer_start), 1 = fence before it (an end, as timer_end), 2 = none.
_CLOCK_REC_SRC = r"""
__device__ __forceinline__ void tl_trace_clock_rec(uint64_t* buf, uint64_t* tag, uint32_t* off,
                                                   int stride, bool leader, int bits, int fence) {
  if (fence == 1) __threadfence_block();
  if (leader) {
    uint32_t t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t));
    buf[off[0]] = ((uint64_t)t << 32) | (tag[0] | (uint32_t)bits);
    off[0] += stride;
  }
  if (fence == 0) __threadfence_block();
}
"""
# clock mode: the pair of anchors, %clock then %globaltimer_lo, read back to back.
_ANCHOR_SRC = r"""
__device__ __forceinline__ void tl_trace_anchor(uint64_t* buf, uint64_t* tag, uint32_t* off,
                                                int stride, bool leader) {
  if (leader) {
    uint32_t c, g;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(g));
    buf[off[0]] = ((uint64_t)c << 32) | (tag[0] | (uint32_t)((14 << 2) | 2));
    off[0] += stride;
    buf[off[0]] = ((uint64_t)g << 32) | (tag[0] | (uint32_t)((15 << 2) | 2));
    off[0] += stride;
  }
}
"""


# the SM this CTA runs on: an instant record whose stamp field holds %smid instead of a time.
_SMID_SRC = r"""
__device__ __forceinline__ void tl_trace_smid(uint64_t* buf, uint64_t* tag, uint32_t* off,
                                              int stride, bool leader) {
  if (leader) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    buf[off[0]] = ((uint64_t)sm << 32) | (tag[0] | (uint32_t)((13 << 2) | 2));
    off[0] += stride;
  }
}
"""


class _Event:
    """What T.cuda.timer_start/end expect as ``event_type``: an object with ``.value``
    (an int, or a PrimExpr when the stage is only known at run time)."""

    def __init__(self, value):
        self.value = value


def _define_tracer():
    from tvm.script import tirx as T

    @T.meta_class
    class Tracer:
        """Device-side trace points; construct inside a ``@T.prim_func`` body.

        buffer     : the ``T.Buffer((n,), "uint64")`` kernel parameter the host fills with zeros.
        num_groups : timeline rows per CTA (warp roles / warps), ``group`` in ``init``.
        num_ctas   : CTAs in the grid (the interleaving stride is num_ctas * num_groups).
        stamp      : "globaltimer" (library intrinsics, ns, comparable across SMs) or "clock"
                     (SM cycle counter, exact within a CTA, aligned through anchors).
        enabled    : False turns every call into nothing (same kernel signature): use it to
                     measure the tracing overhead.
        record_sm  : write the SM id (%smid) once per row at ``init`` (one extra record).
        fence      : clock mode only: a ``__threadfence_block()`` after each begin and before each
                     end, as the library's timer does (MEMBAR.SC.CTA in SASS). False drops it:
                     cheaper, but memory operations may then move across the trace point.
        leader     : default leader predicate, e.g. ``lane_id == 0``. It must pick the SAME thread
                     of the group at every trace point: each thread keeps its own write offset,
                     so never use ``elect_sync()`` here.
        """

        def __init__(self, buffer, num_groups: int, num_ctas: int, *, stamp="globaltimer",
                     enabled=True, leader=None, record_sm=True, fence=True):
            if stamp not in ("globaltimer", "clock"):
                raise ValueError("stamp must be 'globaltimer' or 'clock'")
            self.buffer = buffer
            self.num_groups = int(num_groups)
            self.stride = int(num_ctas) * int(num_groups)
            self.capacity = int(buffer.shape[0])
            self.stamp = stamp
            self.enabled = bool(enabled)
            self.record_sm = bool(record_sm)
            self.fence = bool(fence)
            self.default_leader = leader
            self.tag = T.alloc_buffer([1], "uint64", scope="local", align=8)
            self.off = T.alloc_buffer([1], "uint32", scope="local", align=8)

        # -- helpers (plain Python: run while the kernel is parsed) -------------------------------
        def _cond(self, leader):
            lead = leader if leader is not None else self.default_leader
            room = self.off[0] < T.uint32(self.capacity)      # never write past the buffer
            if lead is None:
                return room
            if isinstance(lead, bool):
                return room if lead else T.bool(False)
            return T.And(lead, room)

        @staticmethod
        def _event(kind, stage):
            code = kind_code(kind)
            if isinstance(stage, int):
                return (stage % (1 << STAGE_BITS)) << 4 | code
            return T.Cast("int32", stage) % (1 << STAGE_BITS) * 16 + code

        # -- the API ------------------------------------------------------------------------------
        def init(self, group, leader=None):
            """Every thread calls this once (thread 0 of CTA 0 writes the buffer header).
            ``group``: this thread's row in the CTA (0 .. num_groups-1), may be an expression."""
            if not self.enabled:
                return
            if leader is not None:
                self.default_leader = leader
            self._init(group)
            if self.record_sm:
                self._smid(self._cond(None))
            if self.stamp == "clock":
                self._anchor(self._cond(None))

        def begin(self, kind, stage=0, leader=None):
            """Start of a region of ``kind`` ("wait", "load", "mma", ...); ``stage`` 0..63 is
            recorded with it (a pipeline stage, a half, ...)."""
            if self.enabled:
                self._rec(self._event(kind, stage), BEGIN, self._cond(leader))

        def end(self, kind, stage=0, leader=None):
            """End of the region opened by ``begin`` with the same kind and stage."""
            if self.enabled:
                self._rec(self._event(kind, stage), END, self._cond(leader))

        def instant(self, kind, stage=0, leader=None):
            """A zero-length marker."""
            if self.enabled:
                self._rec(self._event(kind, stage), INSTANT, self._cond(leader))

        def finalize(self, leader=None):
            """Every thread calls this once at the end: marks the group's records complete."""
            if not self.enabled:
                return
            cond = self._cond(leader)
            if self.stamp == "clock":
                self._anchor(cond)
            self._finalize(self._cond(leader))

        # -- emission (T.inline bodies) -----------------------------------------------------------
        @T.inline
        def _init(self, group):
            T.cuda.timer_init(self.buffer.data, self.tag.data, self.off.data, self.num_groups, group)

        @T.inline
        def _finalize(self, cond):
            T.cuda.timer_finalize(self.buffer.data, self.tag.data, self.off.data, self.stride, cond)

        @T.inline
        def _smid(self, cond):
            T.cuda.func_call("tl_trace_smid", self.buffer.data, self.tag.data, self.off.data,
                             self.stride, cond, source_code=_SMID_SRC)

        @T.inline
        def _anchor(self, cond):
            T.cuda.func_call("tl_trace_anchor", self.buffer.data, self.tag.data, self.off.data,
                             self.stride, cond, source_code=_ANCHOR_SRC)

        def _rec(self, event, typ, cond):
            if self.stamp == "clock":          # the end record fences first, like timer_end
                self._clock_rec(event * 4 + typ, cond, (1 if typ == END else 0) if self.fence else 2)
            elif typ == BEGIN:
                self._gt_begin(_Event(event), cond)
            elif typ == END:
                self._gt_end(_Event(event), cond)
            else:                              # the library has no instant record
                self._gt_instant(event * 4 + INSTANT, cond)

        @T.inline
        def _gt_begin(self, ev, cond):
            T.cuda.timer_start(ev, self.buffer.data, self.tag.data, self.off.data, self.stride, cond)

        @T.inline
        def _gt_end(self, ev, cond):
            T.cuda.timer_end(ev, self.buffer.data, self.tag.data, self.off.data, self.stride, cond)

        @T.inline
        def _gt_instant(self, bits, cond):
            T.cuda.func_call("tl_trace_gt_instant", self.buffer.data, self.tag.data, self.off.data,
                             self.stride, cond, bits, source_code=_GT_INSTANT_SRC)

        @T.inline
        def _clock_rec(self, bits, cond, fence):
            T.cuda.func_call("tl_trace_clock_rec", self.buffer.data, self.tag.data, self.off.data,
                             self.stride, cond, bits, fence, source_code=_CLOCK_REC_SRC)

    return Tracer


_GT_INSTANT_SRC = r"""
__device__ __forceinline__ void tl_trace_gt_instant(uint64_t* buf, uint64_t* tag, uint32_t* off,
                                                    int stride, bool leader, int bits) {
  if (leader) {
    uint32_t t;
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t));
    buf[off[0]] = ((uint64_t)t << 32) | (tag[0] | (uint32_t)bits);
    off[0] += stride;
  }
}
"""

_TRACER = None


def __getattr__(name):            # ``from timeline import Tracer`` builds it on first use only,
    global _TRACER                # so the CPU-only parts never import TVM.
    if name == "Tracer":
        if _TRACER is None:
            _TRACER = _define_tracer()
        return _TRACER
    raise AttributeError(name)


# ----------------------------------------------------------------------------------------------
# (b) decoding
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Event:
    cta: int          # linear CTA index (blockIdx.z * gy + blockIdx.y) * gx + blockIdx.x
    group: int        # row within the CTA (the ``group`` passed to Tracer.init)
    role: str         # group_names[group], or "group<g>"
    kind: str         # "wait", "load", "mma", ...
    start_ns: float   # from the earliest record of the launch
    end_ns: float
    tile: int         # occurrence index of this kind in this row (0, 1, 2, ...: the K tile for
                      # per-K-tile regions)
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
    stamp: str                 # "globaltimer" or "clock"
    clock_ghz: float | None    # clock mode: the rate used to convert cycles to ns
    clock_ghz_source: str | None  # "anchors" (estimated), "given", or "assumed ..."
    records: int               # records read
    truncated_groups: int      # groups with records but no finalize (buffer full or no finalize)
    unmatched: int             # begin without end or end without begin
    bad_tags: int              # records whose group field disagrees with their slot


def _as_u64(buffer) -> np.ndarray:
    if hasattr(buffer, "detach"):                     # torch tensor (any device, int64/uint64)
        t = buffer.detach().cpu()
        try:
            import torch
            if t.dtype != torch.int64 and t.dtype != getattr(torch, "uint64", None):
                raise TypeError(f"trace buffer must be 64-bit, got {t.dtype}")
            t = t.view(torch.int64)
        except ImportError:  # pragma: no cover
            pass
        arr = t.numpy()
    else:
        arr = np.asarray(buffer)
    if arr.dtype.itemsize != 8:
        raise TypeError(f"trace buffer must be 64-bit, got {arr.dtype}")
    return arr.reshape(-1).view(np.uint64)


def _unwrap32(stamps: np.ndarray) -> np.ndarray:
    """Sequential 32-bit stamps of one row (non-decreasing in time) -> int64 without wraps."""
    s = stamps.astype(np.int64)
    if s.size < 2:
        return s
    d = np.diff(s) % (1 << 32)
    return np.concatenate([s[:1], s[0] + np.cumsum(d)])


def _signed32(x):
    x = int(x) % (1 << 32)
    return x - (1 << 32) if x >= (1 << 31) else x


def _pair_row_loop(g, ev, ty, t, ng, names, sm):
    """Begin/end matching of one row, in Python (any nesting; the fallback of ``_pair``)."""
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
    """Begin/end matching of all rows at once (NumPy). Rows in which some event code is not a
    clean begin, end, begin, end, ... sequence go through ``_pair_row_loop`` instead."""
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
    # begins and ends: per (row, code) the types must read 0, 1, 0, 1, ...
    be = np.flatnonzero(ty != INSTANT)
    o = be[np.lexsort((pos[be], ev[be], row[be]))]
    key = row[o] * 1024 + ev[o]
    start = np.r_[True, key[1:] != key[:-1]]
    first = np.maximum.accumulate(np.where(start, np.arange(o.size), 0))
    expect = (np.arange(o.size) - first) % 2
    last = np.r_[key[1:] != key[:-1], True]
    bad_el = (ty[o] != expect) | (last & (expect == 0))        # wrong order, or a final begin
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
    """Trace buffer -> list of ``Event`` (sorted by cta, group, start).

    group_names : list of row names, ``group_names[g]`` for group g (default "group<g>").
    clock_ghz   : clock mode only: SM clock in GHz; default: estimated from the anchors.
    num_ctas, num_groups : only needed if the header is missing (thread 0 of CTA 0 never ran
                  ``init``).
    return_info : also return a ``TraceInfo`` (counts of truncated rows, unmatched records, ...).
    """
    arr = _as_u64(buffer)
    head = int(arr[0])
    nb = num_ctas if num_ctas is not None else head & 0xFFFFFFFF
    ng = num_groups if num_groups is not None else head >> 32
    if nb <= 0 or ng <= 0:
        raise ValueError("trace buffer has no header (was the kernel run with tracing enabled?)")
    stride = nb * ng
    names = list(group_names) if group_names is not None else []

    rows = {}                  # global group -> (stamps uint32, events, types) until finalize
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
    # Times on one axis: per row unwrap, then place the row relative to a common reference.
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
            clk = _unwrap32(st[k != ANCHOR_GLOBAL])           # clock stamps: everything else
            gts = st[k == ANCHOR_GLOBAL]
            anchors[g] = (clk, k[k != ANCHOR_GLOBAL], gts)
        if clock_ghz is None:
            # pooled over rows: sum of cycles / sum of ns between each row's first and last anchor
            # (the globaltimer may tick only every ~1 us; pooling averages its quantisation out)
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
        # All rows of a CTA read the same SM counter: one cycles -> ns map per CTA, its offset the
        # mean over all anchor pairs of the CTA (each pair alone is off by up to a globaltimer tick).
        g_ref = None
        by_cta = defaultdict(list)
        for g in sorted(anchors):
            by_cta[g // ng].append(g)
        for cta, gs in by_cta.items():
            c_ref = int(rows[gs[0]][0][0])                      # raw first stamp of the first row
            rel, samples = {}, []
            for g in gs:
                clk, k, gts = anchors[g]
                raw0 = int(rows[g][0][0])
                rel[g] = clk - clk[0] + _signed32(raw0 - c_ref)   # cycles since c_ref
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
        # keep only non-anchor records, aligned with t_rows
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
    way the device does (header, interleaved slots, tags, 32-bit stamps that may wrap).
    ``base`` is the globaltimer_lo value of time 0 (the default makes the stamps wrap).
    Per row, records are written in time order: begin at start, end at end."""
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
            per_row[g].append((e["end_ns"], 0, code, END))   # an end sorts before a begin at a tie
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


def events_to_json(events, path=None, **meta):
    """Events (+ free-form metadata) -> JSON text; written to ``path`` if given."""
    doc = {"meta": meta, "events": [e.as_dict() if isinstance(e, Event) else dict(e) for e in events]}
    text = json.dumps(doc, indent=None, separators=(",", ":"))
    if path is not None:
        with open(path, "w") as f:
            f.write(text)
    return text


def events_from_json(path):
    with open(path) as f:
        doc = json.load(f)
    return [Event(**d) for d in doc["events"]], doc.get("meta", {})


def summarize(events, ctas=None):
    """Per role: busy time per kind as a fraction of the role's lifetime (first start to last end),
    summed over the selected CTAs. Returns {role: {"span_us":..., kind: fraction, ...}}."""
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


# ----------------------------------------------------------------------------------------------
# (c) drawing
# ----------------------------------------------------------------------------------------------
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
                  min_width_us=0.0, max_labels=48):
    """Draw events as a timeline. One row per (CTA, role), top to bottom in CTA, group order; one
    box per event, coloured by kind; x in microseconds.

    ctas      : an int or a list: only these CTAs (default: all, but at most ``max_rows`` rows).
    window_us : (t0, t1): only this time window (µs from the launch's first record).
    kinds     : only these kinds (default all).
    roles     : only these roles (row names), e.g. one consumer warp per CTA for an overview.
    row_by    : "cta" (default) or "sm": one row per (SM, role), so the CTAs that ran one after
                another on an SM share a row (needs the SM id, recorded by default).
    sms       : with row_by="sm": only these SMs.
    max_rows  : draw at most this many rows (the first ones); max_labels: label every n-th row
                beyond that many.
    min_width_us : draw boxes at least this wide (very short events stay visible).
    Returns the matplotlib Axes; ``ax._timeline_rows`` lists the row labels (top first) and
    ``ax._timeline_boxes`` the number of boxes drawn.
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
        # CTAs resident on one SM at the same time get separate slots (sub-rows): greedy by start
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
        y = len(rows) - 1 - i                          # first row on top
        ax.broken_barh(spans, (y - row_height / 2, row_height),
                       facecolors=KIND_COLORS.get(kind, "#444444"), edgecolors="none")
        nbox += len(spans)

    labels = [f"{name(c)} · {r}" for c, _, r in rows]
    every = max(1, -(-len(rows) // max_labels))
    ticks = [len(rows) - 1 - i for i in range(0, len(rows), every)]
    ax.set_yticks(ticks)
    ax.set_yticklabels([labels[i] for i in range(0, len(rows), every)], fontsize=8 if every == 1 else 6)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("time (µs)")
    if window_us is not None:
        ax.set_xlim(*window_us)
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


def synthetic_pipeline(num_ctas=2, k_tiles=12, stages=2, t_issue=40.0, t_load=600.0,
                       t_mma=450.0, t_epi=1500.0, t_store=300.0, consumers=1, jitter=0.1, seed=0,
                       num_sms=132):
    """Events (ns) of an idealised TMA-producer / MMA-consumer ring of ``stages`` slots, for
    teaching and tests. Group 0 = producer, groups 1.. = consumer warps. The producer waits for a
    free slot, issues the loads (t_issue) whose data lands t_load later; each consumer waits for
    the data, runs its MMAs (t_mma) and frees the slot; then epilogue and store."""
    rng = np.random.default_rng(seed)

    def jit(t):
        return max(t * (1 + jitter * rng.standard_normal()), 1.0)

    ev = []
    for cta in range(num_ctas):
        t0 = cta * 300.0
        released = {}               # k -> time the consumers freed the slot of tile k
        tp = tc = t0
        for k in range(k_tiles):
            s = k % stages
            if k >= stages and released[k - stages] > tp:      # producer: wait for a free slot
                ev.append(Event(cta, 0, "producer", "wait", tp, released[k - stages], k, s))
                tp = released[k - stages]
            ev.append(Event(cta, 0, "producer", "load", tp, tp + t_issue, k, s))
            tp += t_issue
            ready = tp + jit(t_load)
            if ready > tc:                                      # consumers: wait for the data
                for c in range(consumers):
                    ev.append(Event(cta, 1 + c, f"consumer{c}", "wait", tc, ready, k, s))
                tc = ready
            m = jit(t_mma)
            for c in range(consumers):
                ev.append(Event(cta, 1 + c, f"consumer{c}", "mma", tc, tc + m, k, s))
            tc += m
            released[k] = tc
        for c in range(consumers):
            ev.append(Event(cta, 1 + c, f"consumer{c}", "epilogue", tc, tc + t_epi, 0, 0))
            ev.append(Event(cta, 1 + c, f"consumer{c}", "store", tc + t_epi, tc + t_epi + t_store, 0, 0))
    for e in ev:
        e.sm = e.cta % num_sms
    ev.sort(key=lambda e: (e.cta, e.group, e.start_ns))
    return ev
