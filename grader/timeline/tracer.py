"""The device side: the CUDA snippets of the trace points and the ``Tracer`` class, which
``_define_tracer`` builds with TVM's script API when ``grader.timeline.Tracer`` is first asked for."""
from __future__ import annotations

from .records import BEGIN, END, INSTANT, STAGE_BITS, kind_code


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
