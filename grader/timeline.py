"""Pipeline timelines of TIRx kernels: trace points inside a kernel, a decoder, a drawing.

A timeline shows, for every warp role of a few CTAs, when it waited, loaded, multiplied or
stored. It is the quickest way to see whether a pipeline is doing what you think it does.

**Add trace points.** ``from grader.timeline import Tracer, buffer_len, trace_buffer, draw``. Give
the kernel one more argument, a ``uint64`` buffer, create a ``Tracer`` at the top of the kernel
body, and wrap what you want to see in ``begin``/``end``::

    @T.prim_func
    def kernel(A: ..., B: ..., D: ..., prof: T.Buffer((L,), "uint64")):    # L = buffer_len(...)
        ...
        tr = Tracer(prof, num_groups=2, num_ctas=NUM_CTAS, leader=T.And(warp_id == 0, lane_id == 0))
        tr.init(wg_id)                       # every thread, once: its row (here: its warpgroup)
        ...
        tr.begin("wait", stage); T.ptx.mbarrier.try_wait(bar.ptr_to([stage]), phase); tr.end("wait", stage)
        ...
        tr.finalize()                        # every thread, once, at the end

A *group* is one timeline row of a CTA (the producer warp, a consumer warpgroup, ...). ``leader``
picks the one thread per group that writes the records: exactly one thread of each group, the
same one at every trace point (thread 0 of the warpgroup above; ``lane_id == 0`` when every warp
is its own row; never ``elect_sync()``, which may pick another lane each time). Kinds are ``"wait"``, ``"load"``,
``"mma"``, ``"epilogue"``, ``"store"``, ``"sync"``, ``"setup"`` and ``"other"``; ``stage`` (0..63)
rides along with each record.

**Draw the timeline** of the launch with one call::

    prof = trace_buffer(NUM_CTAS, num_groups=2, max_records=4 * K_TILES + 16)   # zeroed, on the GPU
    kernel(A, B, D, prof)
    draw(prof, ["producer", "consumer"], "timeline.png", ctas=[0, 1])

``draw`` decodes the buffer (``decode``), draws it (``draw_timeline``) and saves the figure.
``summarize`` gives each role's time per kind as a fraction of its lifetime, and
``events_to_json`` / ``events_from_json`` keep decoded events for later drawing.

**A builder's timeline in one call.** A builder that takes ``trace=True`` and then returns the
traced kernel, its usual arguments and the trace buffer (Lab 5's ``hopper_step5`` ..
``hopper_step9``: ``kernel(A, B, D, prof)``; Lab 6's ``hopper_attn_step3`` .. ``hopper_attn_step5``:
``kernel(Q, K, V, O, LSE, prof)``) is drawn by ``show(hopper_step7, 4096, 4096, 4096, num_sms,
ctas=[0, 1])`` or ``show(hopper_attn_step4, 4, 4096, 4096, 32, 8, 128, False)``: build, compile,
run, decode, draw (GPU only; without one it says so and does nothing). The inputs are those of
the builder's problem (``grader.problems``), told by its parameter names.

Tracing costs time (a global store per record: on an H200, GEMMs traced at every K tile ran 19%
and 25% slower): read a timeline for its shape, and time the untraced kernel (``Tracer(...,
enabled=False)`` keeps the signature and emits nothing).

**Record format.** ``Tracer`` is a thin wrapper over the in-kernel profiler of apache-tvm 0.26
(``T.cuda.timer_init / timer_start / timer_end / timer_finalize``, which
``tvm.tirx.bench.CudaProfiler`` wraps too), so the buffer has the library's layout::

    buffer[0]            = (num_groups << 32) | num_ctas          written by thread 0 of CTA 0
    buffer[1 + g + i*S]  = i-th record of global group g = cta * num_groups + group,
                           S = num_ctas * num_groups (the records of all groups are interleaved)
    record               = (stamp32 << 32) | (g << 12) | (event << 2) | type
                           type: 0 begin, 1 end, 2 instant, 3 finalize (the row's last record)
                           event (10 bits, this module's convention): kind | stage << 4

``stamp32`` is ``%globaltimer_lo`` (ns, common to all SMs) with ``stamp="globaltimer"``, or
``%clock`` (SM cycles: exact, but per SM) with ``stamp="clock"``. In clock mode the tracer also
writes two *anchors* (a ``%clock`` and a ``%globaltimer_lo`` read back to back) at ``init`` and at
``finalize``; the decoder uses them to put every CTA on the common time axis and to estimate the
SM clock. ``init`` also writes the SM the CTA runs on (``%smid``) as an instant of kind 13
(``record_sm=False`` leaves it out; TVM's ``tvm.tirx.bench.export_to_perfetto_trace`` reads such
traces with an event-name list indexed by ``kind | stage << 4``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict

import numpy as np

# ---------------------------------------------------------------------------------- event kinds
# 4 bits of the 10-bit event field; 13 (the SM id) and 14, 15 (the clock anchors) are reserved.
KINDS = {
    "wait": 0,       # blocked on a barrier (mbarrier try_wait, named barrier): a bubble
    "load": 1,       # issuing TMA loads (the copy itself is asynchronous)
    "mma": 2,        # issuing wgmma / tcgen05 and waiting for them
    "epilogue": 3,   # accumulator -> shared memory (convert, store)
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
STAGE_BITS = 6                       # the stage, 0..63, rides along in the event field


def kind_code(kind) -> int:
    """Kind name or number -> its 4-bit code."""
    if isinstance(kind, str):
        if kind not in KINDS:
            raise ValueError(f"unknown trace kind {kind!r}; known: {sorted(KINDS)} (or pass 0..12)")
        return KINDS[kind]
    code = int(kind)
    if not 0 <= code < SMID:
        raise ValueError(f"trace kind code must be in 0..12, got {code}")
    return code


def buffer_len(num_ctas: int, num_groups: int, max_records: int) -> int:
    """Length of the uint64 trace buffer for ``max_records`` records per group. Count a begin and
    an end as two records, and add 1 for the finalize record, 1 for the SM id and, in clock mode,
    4 for the anchors. A row that runs out of room stops recording (``decode`` reports it as
    truncated); nothing is written past the buffer."""
    return 1 + num_ctas * num_groups * max_records


def trace_buffer(num_ctas: int, num_groups: int, max_records: int, device=None):
    """A zeroed trace buffer as a TVM tensor (on ``tvm.cuda()`` unless ``device`` says otherwise),
    to pass as the kernel's trace argument and then to ``decode`` or ``draw``. A TVM tensor
    rather than a torch one because torch supports uint64 only partly. Zero it again (or make a
    new one) before each launch whose trace you decode."""
    import tvm
    zeros = np.zeros(buffer_len(num_ctas, num_groups, max_records), dtype=np.uint64)
    return tvm.runtime.tensor(zeros, device=device if device is not None else tvm.cuda())


# ---------------------------------------------------------------------------------- device side
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
# globaltimer mode: an instant record (the library has begin and end records only).
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


class _Event:
    """What ``T.cuda.timer_start/end`` take as ``event_type``: an object with ``.value`` (an int,
    or a PrimExpr when the stage is known only at run time)."""

    def __init__(self, value):
        self.value = value


def _define_tracer():
    from tvm.script import tirx as T

    @T.meta_class
    class Tracer:
        """Trace points of a kernel; construct it inside the ``@T.prim_func`` body.

        buffer     : the ``T.Buffer((n,), "uint64")`` kernel argument, zeroed by the host.
        num_groups : timeline rows per CTA (the ``group`` passed to ``init``).
        num_ctas   : CTAs in the grid (the records of all groups are interleaved with stride
                     num_ctas * num_groups).
        stamp      : "globaltimer" (the library's intrinsics; ns, comparable across SMs) or
                     "clock" (the SM's cycle counter; exact within a CTA, aligned by anchors).
        enabled    : False turns every call into nothing, with the same kernel signature: time
                     the kernel this way. ``buffer=None`` is a tracer that is always off: a
                     kernel body shared by a traced and an untraced ``prim_func`` gets it in the
                     untraced one (see :func:`off`).
        leader     : default leader predicate, true for exactly one thread of each group, e.g.
                     ``lane_id == 0`` when every warp is a group. It must pick the SAME thread at
                     every trace point: each thread keeps its own write offset.
        record_sm  : write the SM id once per row at ``init`` (one extra record).
        fence      : clock mode only: a ``__threadfence_block()`` after each begin and before each
                     end, as the library's timer does. False is cheaper, but memory operations
                     may then move across the trace point.
        """

        def __init__(self, buffer, num_groups: int, num_ctas: int, *, stamp="globaltimer",
                     enabled=True, leader=None, record_sm=True, fence=True):
            if stamp not in ("globaltimer", "clock"):
                raise ValueError("stamp must be 'globaltimer' or 'clock'")
            self.buffer = buffer
            self.num_groups = int(num_groups)
            self.stride = int(num_ctas) * int(num_groups)
            self.stamp = stamp
            self.enabled = bool(enabled) and buffer is not None
            self.capacity = int(buffer.shape[0]) if self.enabled else 0
            self.record_sm = bool(record_sm)
            self.fence = bool(fence)
            self.default_leader = leader
            if self.enabled:
                self.tag = T.alloc_buffer([1], "uint64", scope="local", align=8)
                self.off = T.alloc_buffer([1], "uint32", scope="local", align=8)

        # -- helpers (plain Python, run while the kernel is parsed) ------------------------------
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

        # -- the API -----------------------------------------------------------------------------
        def init(self, group, leader=None):
            """Every thread calls this once (thread 0 of CTA 0 also writes the header).
            ``group``: this thread's row in its CTA, 0 .. num_groups - 1 (an expression is fine)."""
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
            """Start of a region of ``kind``; ``stage`` (0..63) is recorded with it."""
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
            """Every thread calls this once at the end: marks its group's records complete."""
            if not self.enabled:
                return
            cond = self._cond(leader)
            if self.stamp == "clock":
                self._anchor(cond)
            self._finalize(self._cond(leader))

        # -- emission ----------------------------------------------------------------------------
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
            if self.stamp == "clock":          # an end record fences first, like timer_end
                self._clock_rec(event * 4 + typ, cond, (1 if typ == END else 0) if self.fence else 2)
            elif typ == BEGIN:
                self._gt_begin(_Event(event), cond)
            elif typ == END:
                self._gt_end(_Event(event), cond)
            else:
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


_TRACER = None


def __getattr__(name):            # ``Tracer`` is built on first use, so that decoding and drawing
    global _TRACER                # never import TVM
    if name == "Tracer":
        if _TRACER is None:
            _TRACER = _define_tracer()
        return _TRACER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


# ---------------------------------------------------------------------------------- one call
NO_GPU = ("timeline.show: no CUDA GPU here, so there is no kernel run to trace; nothing was built or "
          "drawn. Run this cell on a machine with a GPU (the timeline needs one launch of the kernel).")


def _show_args(builder, M, N, K, roles, ctas, path, builder_kwargs, names=("M", "N", "K")):
    """Checks and normalizes show's arguments (plain Python: testable without a GPU). ``names``:
    what the first three shape arguments are called (the builder's problem's fields)."""
    if not callable(builder):
        raise TypeError(f"show: builder must be a kernel builder such as hopper_step7, got {builder!r}")
    for name, v in zip(names, (M, N, K)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"show: {name} must be a positive integer, got {v!r}")
    if "trace" in builder_kwargs:
        raise TypeError("show: do not pass trace=...; show builds the traced kernel itself (trace=True)")
    if roles is not None:
        if isinstance(roles, str) or not all(isinstance(r, str) for r in roles):
            raise TypeError(f"show: roles must be a list of row names such as ['producer', 'consumer'], got {roles!r}")
        roles = list(roles)
    if ctas is not None:
        if isinstance(ctas, (int, np.integer)) and not isinstance(ctas, bool):
            ctas = [int(ctas)]
        elif not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in ctas):
            raise TypeError(f"show: ctas must be a CTA index or a list of them, got {ctas!r}")
        ctas = [int(c) for c in ctas]
        if any(c < 0 for c in ctas):
            raise ValueError(f"show: CTA indices are >= 0, got {ctas}")
    if path is not None:
        path = os.fspath(path)
    return int(M), int(N), int(K), roles, ctas, path


def _show_problem(builder, problem=None):
    """The ``grader.problems`` problem of a builder: the one named ``problem``, else the one with
    the most builder fields that begin the builder's parameters (``M, N, K`` for a GEMM,
    ``batch, seq_q, seq_k, ...`` for attention); a GEMM when none does (or the builder is no
    function)."""
    import inspect
    from . import problems
    if problem is not None:
        return problems.get(problem)
    try:
        params = list(inspect.signature(builder).parameters)
    except (TypeError, ValueError):
        return problems.GEMM
    best = problems.GEMM, 0
    for p in problems.PROBLEMS.values():
        fields = list(p.builder_fields or p.fields)
        if len(fields) >= 3 and params[:len(fields)] == fields and len(fields) > best[1]:
            best = p, len(fields)
    return best[0]


def _kernel_info(func, roles):
    """(buffer length, row names) of a traced kernel: from the attributes the course's
    ``hopper_kernel`` (Lab 5) or ``hopper_attn_kernel`` (Lab 6) attaches."""
    attrs = dict(func.attrs) if getattr(func, "attrs", None) is not None else {}
    length = attrs.get("timeline_buffer_len")
    if roles is None and attrs.get("timeline_roles") is not None:
        roles = [str(r) for r in attrs["timeline_roles"]]
    if length is None:
        raise ValueError("show: the builder's traced kernel does not say how long its trace buffer is: "
                         "return hopper_kernel(body, ..., trace) (Lab 5) or hopper_attn_kernel(body, ..., trace) "
                         "(Lab 6) from the builder (the given last line)")
    return int(length), roles


def show(builder, M, N, K, *args, problem=None, roles=None, ctas=(0, 1), path="timeline.png", title=None,
         window_us=None, seed=0, **builder_kwargs):
    """Draw the timeline of one launch of your kernel, in one call (needs a GPU)::

        fig, events = show(hopper_step7, 4096, 4096, 4096, num_sms, roles=["producer", "consumer"])
        fig, events = show(hopper_attn_step4, 4, 4096, 4096, 32, 8, 128, False)   # Lab 6

    Builds ``builder(M, N, K, *args, trace=True, **builder_kwargs)`` (a kernel
    ``kernel(A, B, D, prof)``), compiles it for the GPU present, makes random fp16 inputs
    A [M, K] and B [N, K], launches it once to warm up, zeroes the trace buffer, launches it again,
    decodes that launch's trace and draws the CTAs ``ctas`` (one row per role, one box per
    traced region). ``roles`` names the rows (default: the names the builder gave). The figure
    is saved to ``path`` (None: not saved). Time is counted from the first record of the CTAs
    drawn, and ``window_us=(t0, t1)`` zooms in on that clock. Prints each role's
    share of its time per kind over all CTAs (``summarize``). Returns ``(figure, events)``, or
    None without a GPU (it then only says so). The traced kernel is slower than the untraced one:
    read the picture for its shape, time the untraced kernel.

    Other problems: the positional arguments are the builder's own, and the inputs and outputs
    are those of its ``grader.problems`` problem (``problem="attention"``, or told by the
    builder's parameter names: ``batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal`` is
    attention, whose traced kernel is ``kernel(Q, K, V, O, LSE, prof)``)."""
    prob = _show_problem(builder, problem)
    names = tuple((prob.builder_fields or prob.fields)[:3])
    M, N, K, roles, ctas, path = _show_args(builder, M, N, K, roles, ctas, path, builder_kwargs, names)
    import torch
    if not torch.cuda.is_available():
        print(NO_GPU)
        return None
    import tvm
    from . import build
    func = builder(M, N, K, *args, trace=True, **builder_kwargs)
    length, roles = _kernel_info(func, roles)
    ex, _ = build.lower(func)                # for the GPU present
    name = getattr(builder, "__name__", "kernel")
    if prob.name == "gemm":
        gen = torch.Generator(device="cuda").manual_seed(seed)
        A = torch.randn(M, K, device="cuda", generator=gen).half()
        B = torch.randn(N, K, device="cuda", generator=gen).half()
        D = torch.empty(M, N, device="cuda", dtype=torch.float16)
        call, label = [A, B, D], f"{M}×{N}×{K}"
    else:                                    # the problem's own inputs (seeded) and outputs
        shape = prob.shape([M, N, K, *args][:len(prob.builder_fields or prob.fields)])
        tensors = {**prob.make_inputs("timeline", name, shape, seed, 0, "cuda"), **prob.make_outputs(shape, "cuda")}
        call, label = prob.args(tensors, prob.draw_scalars("timeline", name, seed, 0)), prob.describe(shape)
    prof = tvm.runtime.tensor(np.zeros(length, dtype=np.uint64), device=tvm.cuda())
    ex(*call, prof)                          # warm-up: clocks up, descriptors and caches filled
    torch.cuda.synchronize()
    prof.copyfrom(np.zeros(length, dtype=np.uint64))
    ex(*call, prof)                          # the launch whose trace is drawn
    torch.cuda.synchronize()
    return _present(prof, roles, ctas, path, title or f"{name} {label}", window_us)


def _present(trace, roles, ctas, path, title, window_us=None):
    """show's second half: decode the launch's trace, print the summary, draw and save."""
    events, info = decode(trace, roles, return_info=True)
    if info.truncated_groups:
        print(f"timeline.show: {info.truncated_groups} rows ran out of buffer room (their ends are missing)")
    ncta = max(1, len({e.cta for e in events}))
    for role, d in summarize(events).items():
        parts = ", ".join(f"{k} {v:.0%}" for k, v in d.items() if k != "span_us")
        print(f"{role}: {parts} of its {d['span_us'] / ncta:.1f} µs (mean over {ncta} CTAs)")
    drawn = events
    if ctas is not None:
        title = f"{title}: CTA{'s' if len(ctas) > 1 else ''} {', '.join(map(str, ctas))}"
        drawn = from_first_record(events, ctas)
        if not drawn:
            print(f"timeline.show: CTAs {list(ctas)} left no record (the launch has CTAs "
                  f"{min(e.cta for e in events)} to {max(e.cta for e in events)})" if events else
                  "timeline.show: the trace has no records")
    if window_us is not None and drawn:
        lo, hi = min(e.start_ns for e in drawn) / 1e3, max(e.end_ns for e in drawn) / 1e3
        if hi < window_us[0] or lo > window_us[1]:
            print(f"timeline.show: nothing in the window {tuple(window_us)} µs: the records drawn run "
                  f"from {lo:.1f} to {hi:.1f} µs")
    fig = draw(drawn, path=path, ctas=ctas, window_us=window_us, title=title)
    return fig, events


def from_first_record(events, ctas) -> list[Event]:
    """The events of ``ctas``, with time counted from the first record among them (so that a
    window such as (0, 8) µs is the first 8 µs of the CTAs drawn, wherever the launch placed
    them)."""
    ctas = {ctas} if isinstance(ctas, (int, np.integer)) else set(ctas)
    mine = [e if isinstance(e, Event) else Event(**e) for e in events]
    mine = [e for e in mine if e.cta in ctas]
    if not mine:
        return []
    t0 = min(e.start_ns for e in mine)
    return [dataclasses.replace(e, start_ns=e.start_ns - t0, end_ns=e.end_ns - t0) for e in mine]
