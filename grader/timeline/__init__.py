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

from .decoding import Event, TraceInfo, decode, encode
from .drawing import draw, draw_recorded, draw_timeline, events_from_json, events_to_json, summarize
from .records import (ANCHOR_CLOCK, ANCHOR_GLOBAL, BEGIN, END, FINALIZE, INSTANT, KIND_COLORS, KIND_NAMES, KINDS,
                      SMID, STAGE_BITS, buffer_len, kind_code, trace_buffer)
from .showing import NO_GPU, from_first_record, show
from .tracer import _define_tracer
from . import showing as _showing

__all__ = ["KINDS", "SMID", "ANCHOR_CLOCK", "ANCHOR_GLOBAL", "KIND_NAMES", "KIND_COLORS", "BEGIN", "END", "INSTANT",
           "FINALIZE", "STAGE_BITS", "kind_code", "buffer_len", "trace_buffer", "Event", "TraceInfo", "decode",
           "encode", "events_to_json", "events_from_json", "summarize", "draw_timeline", "draw_recorded", "draw",
           "NO_GPU", "show", "from_first_record"]     # and Tracer, built on first use (below)

# show's helpers, which the tests call as grader.timeline._show_args, ...
_show_args, _show_problem, _kernel_info, _present = (_showing._show_args, _showing._show_problem,
                                                      _showing._kernel_info, _showing._present)

_TRACER = None


def __getattr__(name):            # ``Tracer`` is built on first use, so that decoding and drawing
    global _TRACER                # never import TVM
    if name == "Tracer":
        if _TRACER is None:
            _TRACER = _define_tracer()
        return _TRACER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
