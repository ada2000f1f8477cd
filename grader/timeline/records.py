"""The record format's vocabulary: the event kinds, their codes and colours, the record types,
and the trace buffer (its length, a zeroed one on the GPU)."""
from __future__ import annotations

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
