"""grader.timeline on the CPU: the record format both ways, the device code run on the host, the
drawing, and the recorded H200 trace the Lab 5 notes draw from.

1. decode(encode(events)) == events, in globaltimer and clock mode, across a 32-bit wrap.
2. The tag layout agrees with TVM's own reader (tvm.tirx.bench.decode_tag).
3. The device format itself: the CUDA helpers TVM generates for a traced kernel are compiled for
   the host with g++ (globaltimer, clock and smid faked), driven the way the kernel drives them,
   and the buffer they write is decoded; the capacity guard keeps every write inside the buffer.
4. draw_timeline / draw: the right rows, one box per event, the kind colours in the pixels.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from grader import timeline as tl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDED = os.path.join(ROOT, "reports", "h200", "lab5", "timeline_events.json")
NAMES = ["producer", "consumer0", "consumer1"]


def synthetic_pipeline(num_ctas=2, k_tiles=12, stages=2, t_issue=40.0, t_load=600.0, t_mma=450.0,
                       t_epi=1500.0, t_store=300.0, consumers=1, jitter=0.1, seed=0, num_sms=132):
    """Events (ns) of an idealised TMA-producer / MMA-consumer ring of ``stages`` slots. Group 0
    is the producer, groups 1.. the consumers. The producer waits for a free slot and issues the
    loads (t_issue), whose data lands t_load later; each consumer waits for the data, runs its
    MMAs (t_mma) and frees the slot; then the epilogue and the store."""
    rng = np.random.default_rng(seed)

    def jit(t):
        return max(t * (1 + jitter * rng.standard_normal()), 1.0)

    ev = []
    for cta in range(num_ctas):
        t0 = cta * 300.0
        released = {}               # k -> when the consumers freed the slot of K tile k
        tp = tc = t0
        for k in range(k_tiles):
            s = k % stages
            if k >= stages and released[k - stages] > tp:
                ev.append(tl.Event(cta, 0, "producer", "wait", tp, released[k - stages], k, s))
                tp = released[k - stages]
            ev.append(tl.Event(cta, 0, "producer", "load", tp, tp + t_issue, k, s))
            tp += t_issue
            ready = tp + jit(t_load)
            if ready > tc:
                for c in range(consumers):
                    ev.append(tl.Event(cta, 1 + c, f"consumer{c}", "wait", tc, ready, k, s))
                tc = ready
            m = jit(t_mma)
            for c in range(consumers):
                ev.append(tl.Event(cta, 1 + c, f"consumer{c}", "mma", tc, tc + m, k, s))
            tc += m
            released[k] = tc
        for c in range(consumers):
            ev.append(tl.Event(cta, 1 + c, f"consumer{c}", "epilogue", tc, tc + t_epi, 0, 0))
            ev.append(tl.Event(cta, 1 + c, f"consumer{c}", "store", tc + t_epi, tc + t_epi + t_store, 0, 0))
    for e in ev:
        e.sm = e.cta % num_sms
    ev.sort(key=lambda e: (e.cta, e.group, e.start_ns))
    return ev


def _key(e):
    return (e.cta, e.group, e.kind, round(e.start_ns, 3), round(e.end_ns, 3), e.stage, e.sm)


def _renumber(events):
    """The decoder's ``tile``: the occurrence of the kind within its row."""
    seen, out = {}, []
    for e in sorted(events, key=lambda e: (e.cta, e.group, e.start_ns, e.end_ns)):
        n = seen.get((e.cta, e.group, e.kind), 0)
        seen[(e.cta, e.group, e.kind)] = n + 1
        out.append(tl.Event(e.cta, e.group, e.role, e.kind, e.start_ns, e.end_ns, n, e.stage, e.sm))
    return out


def _shift(events):
    t0 = min(e.start_ns for e in events)
    return [tl.Event(e.cta, e.group, e.role, e.kind, e.start_ns - t0, e.end_ns - t0, e.tile, e.stage, e.sm)
            for e in events]


def _synthetic():
    """3 CTAs on 2 SMs, a producer and two consumers, integer ns."""
    ev = synthetic_pipeline(num_ctas=3, k_tiles=10, stages=2, consumers=2, seed=1, num_sms=2)
    ev = [tl.Event(e.cta, e.group, e.role, e.kind, round(e.start_ns), round(e.end_ns), e.tile, e.stage, e.sm)
          for e in ev]
    return _shift(_renumber(ev))


# ------------------------------------------------------------------------- 1, 2: the format
def test_roundtrip_globaltimer():
    ev = _synthetic()
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=64)
    stamps = (buf[1:][buf[1:] != 0] >> np.uint64(32)).astype(np.int64)
    assert stamps.min() < 1_000_000 and stamps.max() > 4_290_000_000, "the test must cross a wrap"
    got, info = tl.decode(buf, NAMES, return_info=True)
    assert info.stamp == "globaltimer" and info.truncated_groups == 0 and info.unmatched == 0
    assert info.num_ctas == 3 and info.num_groups == 3 and info.bad_tags == 0
    assert sorted(map(_key, got)) == sorted(map(_key, ev))
    assert [e.tile for e in got] == [e.tile for e in sorted(ev, key=lambda e: (e.cta, e.group, e.start_ns, e.end_ns))]
    assert {e.role for e in got} == set(NAMES)


def test_roundtrip_clock():
    ev = _synthetic()
    ghz = 1.755
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=64, stamp="clock", clock_ghz=ghz)
    got, info = tl.decode(buf, NAMES, return_info=True)
    assert info.stamp == "clock" and abs(info.clock_ghz - ghz) < 1e-3, info
    assert len(got) == len(ev)
    for a, b in zip(sorted(got, key=_key), sorted(ev, key=_key)):
        assert (a.cta, a.group, a.kind, a.stage, a.tile) == (b.cta, b.group, b.kind, b.stage, b.tile)
        assert abs(a.start_ns - b.start_ns) < 2 and abs(a.end_ns - b.end_ns) < 2
    assert len(tl.decode(buf, NAMES, clock_ghz=ghz)) == len(ev)      # a given clock instead


def test_buffer_types():
    """The buffer may come back as a torch tensor (int64 or uint64), a TVM tensor or NumPy."""
    import torch
    import tvm
    ev = _synthetic()
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=64)
    want = sorted(map(_key, ev))
    as_int64 = torch.from_numpy(buf.view(np.int64).copy())
    assert sorted(map(_key, tl.decode(as_int64, NAMES))) == want
    if hasattr(torch, "uint64"):
        assert sorted(map(_key, tl.decode(as_int64.view(torch.uint64), NAMES))) == want
    assert sorted(map(_key, tl.decode(tvm.runtime.tensor(buf, device=tvm.cpu()), NAMES))) == want
    with pytest.raises(TypeError):
        tl.decode(torch.zeros(8, dtype=torch.int32))
    fresh = tl.trace_buffer(3, 3, 16, device=tvm.cpu())
    assert fresh.shape[0] == tl.buffer_len(3, 3, 16) and not fresh.numpy().any()


def test_truncated_and_missing_header():
    ev = _synthetic()
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=64, finalize=False)
    _, info = tl.decode(buf, NAMES, return_info=True)
    assert info.truncated_groups == 9
    buf[0] = 0
    with pytest.raises(ValueError, match="no header"):
        tl.decode(buf)
    assert len(tl.decode(buf, num_ctas=3, num_groups=3)) == len(ev)


def test_nested_and_unmatched_records():
    """A row that is not a clean begin/end alternation goes through the slow matcher: nested
    begins pair inside out, an end without a begin is counted."""
    buf = np.zeros(16, dtype=np.uint64)
    buf[0] = (1 << 32) | 1                                   # 1 CTA, 1 group
    recs = [(100, 0), (200, 0), (300, 1), (400, 1), (500, 1), (600, 3)]   # B B E E E F, "wait"
    for i, (stamp, typ) in enumerate(recs):
        buf[1 + i] = np.uint64((stamp << 32) | typ)
    ev, info = tl.decode(buf, return_info=True)
    assert [(e.start_ns, e.end_ns) for e in ev] == [(0, 300), (100, 200)]
    assert info.unmatched == 1 and [e.tile for e in ev] == [0, 1]


def test_kind_codes():
    assert tl.kind_code("mma") == 2 and tl.kind_code(7) == 7
    with pytest.raises(ValueError):
        tl.kind_code("compute")
    with pytest.raises(ValueError):
        tl.kind_code(tl.SMID)                                 # reserved


def test_tag_layout_matches_tvm_reader(monkeypatch):
    """tvm.tirx.bench.decode_tag is TVM's reading of the same records. The module imports
    triton, which the course does not install; a stand-in is enough (decode_tag is plain
    Python), and it is removed again after the test."""
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.profiler",
                        sys.modules.get("triton.profiler") or types.ModuleType("triton.profiler"))
    from tvm.tirx import bench
    buf = tl.encode(_synthetic(), num_ctas=3, num_groups=3, max_records=64)
    ng, stride, seen = int(buf[0]) >> 32, 9, 0
    for g in range(stride):
        for rec in buf[1 + g::stride]:
            if rec == 0:
                break
            cta, grp, event, typ = bench.decode_tag(int(rec) & 0xFFFFFFFF, ng)
            assert (cta, grp) == divmod(g, ng)
            if typ == tl.INSTANT:
                assert event == tl.SMID
            elif typ != tl.FINALIZE:
                assert (event & 0xF) in tl.KIND_NAMES and (event >> 4) in (0, 1)   # kind | stage << 4
            seen += 1
    assert seen > 100


# ------------------------------------------------------------------------- 3: the device code on the host
_NB, _NG, _REC = 3, 2, 12


def _traced_kernel(stamp, records=_REC):
    from tvm.script import tirx as T
    L = tl.buffer_len(_NB, _NG, records)
    Tracer = tl.Tracer

    @T.prim_func
    def k(prof: T.Buffer((L,), "uint64"), out: T.Buffer((_NB * 64,), "float32")):
        T.device_entry()
        bx = T.cta_id([_NB])
        warp = T.warp_id([_NG])
        lane = T.lane_id([32])
        tr = Tracer(prof, _NG, _NB, stamp=stamp, leader=(lane == 0))
        tr.init(warp)
        for i in T.serial(3):
            tr.begin("wait", i % 2)
            out[bx * 64 + warp * 32 + lane] = T.float32(1)
            tr.end("wait", i % 2)
        tr.finalize()
    return k


def _helpers(src):
    """The __device__ helpers of a generated CUDA source, as host C++ with fake timers."""
    funcs = []
    for m in re.finditer(r"(__forceinline__ __device__|__device__ __forceinline__)[^{;]*?"
                         r"(tvm_builtin_get_timestamp|tvm_builtin_timer_\w+|tl_trace_\w+)\s*\(", src):
        depth, i = 0, src.index("{", m.end())
        for j in range(i, len(src)):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                funcs.append(src[m.start():j + 1])
                break
    code = "\n\n".join(funcs).replace("__forceinline__", "inline").replace("__device__", "")
    code = re.sub(r'asm volatile\("mov\.u32 %0, %+globaltimer_lo;" : "=r"\((\w+)\)\);',
                  r"\1 = fake_globaltimer();", code)
    code = re.sub(r'asm volatile\("mov\.u32 %0, %+clock;" : "=r"\((\w+)\)\);', r"\1 = fake_clock();", code)
    code = re.sub(r'asm volatile\("mov\.u32 %0, %+smid;" : "=r"\((\w+)\)\);', r"\1 = fake_smid();", code)
    assert "asm" not in code, code
    return code


_DRIVER = r"""
typedef unsigned int uint;
#include <cstdint>
#include <cstdio>
#include <vector>
struct dim3_ { unsigned x, y, z; };
static dim3_ blockIdx, threadIdx, gridDim;
static double g_now = 0;               // ns since the launch
static const double BASE = 4294965800.0, GHZ = 1.5;  // the stamps wrap after 1.5 us
#ifdef COARSE   // a globaltimer that ticks once per microsecond
static uint32_t fake_globaltimer() { return (uint32_t)((uint64_t)((BASE + g_now) / 1000.0) * 1000); }
#else
static uint32_t fake_globaltimer() { return (uint32_t)(uint64_t)(BASE + g_now); }
#endif
static uint32_t fake_clock() { return (uint32_t)(uint64_t)(1000000.0 * (blockIdx.x + 1) + g_now * GHZ); }
static uint32_t fake_smid() { return 7 * blockIdx.x + 3; }
static void __threadfence_block() {}
HELPERS
int main() {
  const int NB = @NB@, NG = @NG@, L = @L@, GUARD = 64;
  std::vector<uint64_t> buf(L + GUARD, 0);
  for (int i = 0; i < GUARD; ++i) buf[L + i] = 0xDEADBEEFDEADBEEFull;
  gridDim = {(unsigned)NB, 1, 1};
  // every CTA, every warp (= group), lane 0 leads; the kernel's loop: 3 x (begin, end)
  for (int b = 0; b < NB; ++b) for (int w = 0; w < NG; ++w) {
    blockIdx = {(unsigned)b, 0, 0}; threadIdx = {(unsigned)(32 * w), 0, 0};
    uint64_t tag[1]; uint32_t off[1];
    g_now = 1000.0 * b + 100.0 * w;
    tvm_builtin_timer_init_cuda(buf.data(), tag, off, NG, w);
    tl_trace_smid(buf.data(), tag, off, NB * NG, (off[0] < (uint)L));
    INIT_EXTRA
    for (int i = 0; i < 3; ++i) {
      int ev = (i & 1) * 16 + 0;
      g_now += 50; BEGIN_CALL
      g_now += 200 + 10 * i; END_CALL
    }
    g_now += 5; FINAL_CALL
  }
  for (int i = 0; i < GUARD; ++i) if (buf[L + i] != 0xDEADBEEFDEADBEEFull) { printf("OVERRUN\n"); return 1; }
  fwrite(buf.data(), 8, L, stdout);
  return 0;
}
"""


def _run_device_format(tmp_path, stamp, records=_REC, coarse=False):
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the generated helpers for the host")
    from grader.build import lower
    _, src = lower(_traced_kernel(stamp, records), "sm_90a")
    L = tl.buffer_len(_NB, _NG, records)
    body = src[src.index('extern "C" __global__'):]
    cond = f"(off[0] < (uint){L})"          # the guard the Tracer emits, lane 0 leading
    assert f"< (uint){L}" in body, "the capacity guard must be in the kernel"
    assert "tl_trace_smid(" in body
    stride = "NB * NG"
    if stamp == "globaltimer":
        assert "tvm_builtin_timer_start_cuda" in body and "tvm_builtin_timer_end_cuda" in body
        begin = f"tvm_builtin_timer_start_cuda(ev, buf.data(), tag, off, {stride}, {cond});"
        end = f"tvm_builtin_timer_end_cuda(ev, buf.data(), tag, off, {stride}, {cond});"
        extra, final = "", f"tvm_builtin_timer_finalize_cuda(buf.data(), tag, off, {stride}, {cond});"
    else:
        assert "tl_trace_clock_rec" in body and "tl_trace_anchor" in body
        begin = f"tl_trace_clock_rec(buf.data(), tag, off, {stride}, {cond}, ev * 4 + 0, 0);"
        end = f"tl_trace_clock_rec(buf.data(), tag, off, {stride}, {cond}, ev * 4 + 1, 1);"
        extra = f"tl_trace_anchor(buf.data(), tag, off, {stride}, {cond});"
        final = extra + f" tvm_builtin_timer_finalize_cuda(buf.data(), tag, off, {stride}, {cond});"
    cpp = (_DRIVER.replace("HELPERS", _helpers(src)).replace("INIT_EXTRA", extra)
           .replace("BEGIN_CALL", begin).replace("END_CALL", end).replace("FINAL_CALL", final)
           .replace("@NB@", str(_NB)).replace("@NG@", str(_NG)).replace("@L@", str(L)))
    (tmp_path / "emu.cpp").write_text(cpp)
    exe = str(tmp_path / "emu")
    subprocess.run(["g++", "-O1", "-std=c++17"] + (["-DCOARSE"] if coarse else []) + ["-o", exe, str(tmp_path / "emu.cpp")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([exe], capture_output=True, check=True).stdout
    return np.frombuffer(out, dtype=np.uint64).copy()


def _expected_device_events():
    ev = []
    for b in range(_NB):
        for w in range(_NG):
            t = 1000.0 * b + 100.0 * w
            for i in range(3):
                t += 50
                t1 = t + 200 + 10 * i
                ev.append(tl.Event(b, w, f"warp{w}", "wait", t, t1, i, i % 2, 7 * b + 3))
                t = t1
    return _shift(ev)


def test_device_format_globaltimer(tmp_path):
    buf = _run_device_format(tmp_path, "globaltimer")
    assert int(buf[0]) == (_NG << 32) | _NB                          # header from CTA 0, thread 0
    stamps = (buf[1:][buf[1:] != 0] >> np.uint64(32)).astype(np.int64)
    assert stamps.min() < 10_000 and stamps.max() > 4_294_000_000, "the stamps must wrap"
    got, info = tl.decode(buf, ["warp0", "warp1"], return_info=True)
    assert info.truncated_groups == 0 and info.unmatched == 0 and info.bad_tags == 0
    exp = _expected_device_events()
    assert sorted(map(_key, got)) == sorted(map(_key, exp))
    assert [e.tile for e in got] == [e.tile for e in exp]


def test_device_format_clock(tmp_path):
    buf = _run_device_format(tmp_path, "clock")
    got, info = tl.decode(buf, ["warp0", "warp1"], return_info=True)
    assert info.stamp == "clock" and abs(info.clock_ghz - 1.5) < 0.01, info
    exp = _expected_device_events()
    assert len(got) == len(exp)
    for a, b in zip(sorted(got, key=_key), sorted(exp, key=_key)):
        assert (a.cta, a.group, a.kind, a.stage, a.tile) == (b.cta, b.group, b.kind, b.stage, b.tile)
        assert abs(a.start_ns - b.start_ns) < 2 and abs(a.end_ns - b.end_ns) < 2, (a, b)


def test_device_format_clock_coarse_globaltimer(tmp_path):
    """With a globaltimer that ticks once per microsecond, clock mode still places the rows of a
    CTA exactly relative to each other (one SM counter, one offset per CTA); only the CTA as a
    whole may shift, by less than a tick. Globaltimer mode sees whole microseconds only."""
    buf = _run_device_format(tmp_path, "clock", coarse=True)
    got = sorted(tl.decode(buf, ["warp0", "warp1"], clock_ghz=1.5), key=_key)
    exp = sorted(_expected_device_events(), key=_key)
    assert len(got) == len(exp)
    for cta in range(_NB):
        a = [e for e in got if e.cta == cta]
        b = [e for e in exp if e.cta == cta]
        shift = a[0].start_ns - b[0].start_ns
        assert abs(shift) < 1000, shift
        for x, y in zip(a, b):
            assert abs((x.start_ns - shift) - y.start_ns) < 2 and abs((x.end_ns - shift) - y.end_ns) < 2
    g = tl.decode(_run_device_format(tmp_path, "globaltimer", coarse=True))
    assert all(round(e.start_ns) % 1000 == round(g[0].start_ns) % 1000 for e in g)


def test_device_format_capacity_guard(tmp_path):
    """A buffer too small for the records: nothing is written past it, the rows are reported
    truncated, and the complete begin/end pairs that fit are still decoded."""
    buf = _run_device_format(tmp_path, "globaltimer", records=5)     # 1 + 6 + 1 records wanted per row
    got, info = tl.decode(buf, return_info=True)
    assert info.truncated_groups == _NB * _NG
    assert len(got) == 2 * _NB * _NG


def test_disabled_tracer_emits_nothing():
    from tvm.script import tirx as T
    from grader.build import lower
    Tracer = tl.Tracer

    @T.prim_func
    def k(prof: T.Buffer((1,), "uint64"), out: T.Buffer((32,), "float32")):
        T.device_entry()
        T.cta_id([1])
        T.warp_id([1])
        lane = T.lane_id([32])
        tr = Tracer(prof, 1, 1, enabled=False, leader=(lane == 0))
        tr.init(0)
        tr.begin("mma")
        out[lane] = T.float32(1)
        tr.end("mma")
        tr.finalize()

    _, src = lower(k, "sm_90a")
    body = src[src.index('extern "C" __global__'):]
    assert "timer" not in body and "tl_trace" not in body


# ------------------------------------------------------------------------- 4: drawing
def _pixels_by_kind(fig):
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3]
    found = {}
    for kind, hexcol in tl.KIND_COLORS.items():
        rgb = np.array([int(hexcol[i:i + 2], 16) for i in (1, 3, 5)])
        found[kind] = int(np.all(img == rgb, axis=-1).sum())
    return found


@pytest.fixture
def plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    yield pyplot
    pyplot.close("all")


def test_draw_timeline(plt):
    ev = _synthetic()
    fig, ax = plt.subplots(figsize=(12, 3.5))
    tl.draw_timeline(ev, ax=ax, title="synthetic 2-stage pipeline")
    rows = [f"CTA {c} @SM {c % 2} · {r}" for c in range(3) for r in NAMES]
    assert ax._timeline_rows == rows
    top_down = sorted(zip(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]), reverse=True)
    assert [label for _, label in top_down] == rows                    # the first row on top
    assert ax._timeline_boxes == len(ev)
    assert sum(len(c.get_paths()) for c in ax.collections) == len(ev)
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == sorted({e.kind for e in ev})
    pixels = _pixels_by_kind(fig)
    for kind in {e.kind for e in ev}:
        assert pixels[kind] > 50, (kind, pixels)
    assert pixels["sync"] == 0

    fig, ax = plt.subplots(figsize=(12, 2.5))                         # one CTA, a time window
    tl.draw_timeline(ev, ax=ax, ctas=1, window_us=(2.0, 6.0), min_width_us=0.01)
    assert ax._timeline_rows == [f"CTA 1 @SM 1 · {r}" for r in NAMES]
    inside = [e for e in ev if e.cta == 1 and e.end_ns >= 2000 and e.start_ns <= 6000]
    assert ax._timeline_boxes == len(inside)
    assert ax.get_xlim() == (2.0, 6.0)


def test_draw_by_sm(plt):
    ev = _synthetic()                  # 3 CTAs on 2 SMs; CTA 2 overlaps CTA 0 on SM 0 in time
    fig, ax = plt.subplots()
    tl.draw_timeline(ev, ax=ax, row_by="sm")
    assert ax._timeline_rows == ([f"SM 0 · {r}" for r in NAMES] + [f"SM 0.1 · {r}" for r in NAMES]
                                 + [f"SM 1 · {r}" for r in NAMES])
    assert ax._timeline_boxes == len(ev)
    end0 = max(e.end_ns for e in ev if e.cta == 0)                    # moved after CTA 0's end,
    lo2 = min(e.start_ns for e in ev if e.cta == 2)                   # CTA 2 shares CTA 0's row
    ev2 = [tl.Event(**{**e.as_dict(), "start_ns": e.start_ns + end0 - lo2 + 10, "end_ns": e.end_ns + end0 - lo2 + 10})
           if e.cta == 2 else e for e in ev]
    fig, ax = plt.subplots()
    tl.draw_timeline(ev2, ax=ax, row_by="sm")
    assert ax._timeline_rows == [f"SM {s} · {r}" for s in range(2) for r in NAMES]
    assert ax._timeline_boxes == len(ev)


def test_draw_in_one_call(plt, tmp_path):
    ev = _synthetic()
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=64)
    path = tmp_path / "timeline.png"
    fig = tl.draw(buf, NAMES, path, ctas=[0, 1], title="two CTAs")
    ax = fig.axes[0]
    assert ax._timeline_rows == [f"CTA {c} @SM {c % 2} · {r}" for c in range(2) for r in NAMES]
    assert ax._timeline_boxes == len([e for e in ev if e.cta < 2])
    assert ax.get_title() == "two CTAs"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = tl.draw(ev, roles=["producer"])                             # events work as well
    assert fig.axes[0]._timeline_rows == [f"CTA {c} @SM {c % 2} · producer" for c in range(3)]


def test_json_and_summary(tmp_path):
    ev = _synthetic()
    path = tmp_path / "events.json"
    tl.events_to_json(ev, path, kernel="synthetic")
    back, meta = tl.events_from_json(path)
    assert meta == {"kernel": "synthetic"} and back == ev
    s = tl.summarize(ev)
    assert set(s) == set(NAMES)
    for role in NAMES:
        lifetime = [e for e in ev if e.role == role]
        assert 0 < sum(v for k, v in s[role].items() if k != "span_us") <= 1.0 + 1e-9
        assert s[role]["span_us"] == pytest.approx(
            sum((max(e.end_ns for e in lifetime if e.cta == c) - min(e.start_ns for e in lifetime if e.cta == c)) / 1e3
                for c in range(3)), abs=1e-3)
    assert 0 < s["consumer0"]["mma"] < 1 and s["producer"]["load"] > 0


def test_recorded_h200_trace(plt):
    """The trace the Lab 5 notes draw: small, complete for what it keeps, drawable."""
    assert os.path.getsize(RECORDED) < 100_000
    ev, meta = tl.events_from_json(RECORDED)
    assert meta["decode_info"]["unmatched"] == 0 and meta["decode_info"]["bad_tags"] == 0
    assert meta["trim"]["kept_ctas"] == sorted({e.cta for e in ev})
    roles = meta["group_names"]
    assert {(e.cta, e.role) for e in ev} == {(c, r) for c in meta["trim"]["kept_ctas"] for r in roles}
    assert {"wait", "load", "mma", "epilogue", "store"} <= {e.kind for e in ev}
    assert all(e.end_ns >= e.start_ns >= 0 for e in ev)
    ax = tl.draw_timeline(ev, ctas=meta["trim"]["kept_ctas"][0], window_us=(0, 6))
    assert ax._timeline_rows[0].endswith("· " + roles[0]) and len(ax._timeline_rows) == len(roles)


# ---------------------------------------------------------------- show: one call (its CPU parts)
LAB5_ROLES = ["producer", "consumer 0", "consumer 1"]


def _never_called(*a, **k):
    raise AssertionError("the builder must not be called")


def test_show_checks_its_arguments():
    args = tl._show_args(_never_called, 256, 128, 64, ("producer", "consumer"), (0, 3), None, {"num_sms": 4})
    assert args == (256, 128, 64, ["producer", "consumer"], [0, 3], None)
    assert tl._show_args(_never_called, 8, 8, 64, None, 2, "t.png", {})[3:] == (None, [2], "t.png")
    bad = [((None, 8, 8, 64), {}, TypeError, "builder"), ((_never_called, 0, 8, 64), {}, ValueError, "M"),
           ((_never_called, 8, 8.0, 64), {}, ValueError, "N"), ((_never_called, 8, 8, True), {}, ValueError, "K"),
           ((_never_called, 8, 8, 64), {"roles": "producer"}, TypeError, "roles"),
           ((_never_called, 8, 8, 64), {"ctas": [0, "1"]}, TypeError, "ctas"),
           ((_never_called, 8, 8, 64), {"ctas": [-1]}, ValueError, "CTA"),
           ((_never_called, 8, 8, 64), {"trace": True}, TypeError, "trace")]
    for pos, kw, exc, word in bad:
        with pytest.raises(exc, match=word):
            tl.show(*pos, **kw)


def test_show_without_a_gpu_says_so_and_does_nothing(monkeypatch, capsys, tmp_path):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tl.show(_never_called, 4096, 4096, 4096, 132, roles=["producer", "consumer"],
                   path=tmp_path / "t.png") is None
    assert capsys.readouterr().out.strip() == tl.NO_GPU
    assert not (tmp_path / "t.png").exists()


def test_show_reads_the_kernels_roles_and_buffer_length():
    func = types.SimpleNamespace(attrs={"timeline_roles": LAB5_ROLES, "timeline_buffer_len": 99})
    assert tl._kernel_info(func, None) == (99, LAB5_ROLES)
    assert tl._kernel_info(func, ["p", "c0", "c1"]) == (99, ["p", "c0", "c1"])
    with pytest.raises(ValueError, match="hopper_kernel"):
        tl._kernel_info(types.SimpleNamespace(attrs=None), None)


def test_show_draws_a_lab5_trace(plt, tmp_path, capsys):
    """show's second half on a clock-stamped buffer laid out like Lab 5's step 8/9 kernels."""
    ev = synthetic_pipeline(num_ctas=3, stages=4, consumers=2)
    ev = [tl.Event(**{**e.as_dict(), "role": LAB5_ROLES[e.group]}) for e in ev]
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=128, stamp="clock")
    fig, back = tl._present(buf, LAB5_ROLES, [0, 1], str(tmp_path / "t.png"), "hopper_step8 demo")
    assert len(back) == len(ev) and {e.role for e in back} == set(LAB5_ROLES)
    ax = fig.axes[0]
    assert [r.split(" · ")[1] for r in ax._timeline_rows] == LAB5_ROLES * 2
    assert ax._timeline_boxes == len([e for e in ev if e.cta < 2])
    assert ax.get_title() == "hopper_step8 demo: CTAs 0, 1"
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert all(f"{r}: " in out for r in LAB5_ROLES) and "mma" in out


def test_show_counts_time_from_the_first_record_of_the_ctas_drawn(plt, tmp_path, capsys):
    """A window such as (0, 8) µs is the first 8 µs of the CTAs drawn, even when the launch's
    first record is far earlier (CTAs of a later wave, or SM clocks aligned by anchors)."""
    ev = synthetic_pipeline(num_ctas=3, stages=4, consumers=2)
    late = 50_000.0                                    # CTAs 1 and 2 start 50 µs after CTA 0
    ev = [tl.Event(**{**e.as_dict(), "role": LAB5_ROLES[e.group],
                      "start_ns": e.start_ns + (late if e.cta else 0), "end_ns": e.end_ns + (late if e.cta else 0)})
          for e in ev]
    buf = tl.encode(ev, num_ctas=3, num_groups=3, max_records=128, stamp="clock")
    fig, _ = tl._present(buf, LAB5_ROLES, [1, 2], str(tmp_path / "t.png"), "late", window_us=(0, 8))
    assert fig.axes[0]._timeline_boxes > 0                      # not an empty picture
    shifted = tl.from_first_record(tl.decode(buf, LAB5_ROLES), [1, 2])
    assert min(e.start_ns for e in shifted) == 0 and {e.cta for e in shifted} == {1, 2}
    assert "nothing in the window" not in capsys.readouterr().out
    tl._present(buf, LAB5_ROLES, [1], None, "far", window_us=(10_000, 10_008))
    assert "nothing in the window (10000, 10008) µs" in capsys.readouterr().out
    tl._present(buf, LAB5_ROLES, [7], None, "absent")
    assert "CTAs [7] left no record" in capsys.readouterr().out


def _attn_builder(batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal, stages=3, trace=False):
    raise AssertionError("the builder must not be called")


def _gemm_builder(M, N, K, num_sms, stages=4, trace=False):
    raise AssertionError("the builder must not be called")


def test_show_tells_the_problem_by_the_builders_parameters(monkeypatch, capsys):
    """Lab 6's builders (batch, seq_q, seq_k, ...) get attention inputs, Lab 5's (M, N, K, ...)
    and anything unrecognizable GEMM inputs, unless problem= says otherwise."""
    assert tl._show_problem(_attn_builder).name == "attention"
    assert tl._show_problem(_gemm_builder).name == "gemm"
    assert tl._show_problem(_never_called).name == "gemm"
    assert tl._show_problem(None).name == "gemm"
    assert tl._show_problem(_never_called, "attention").name == "attention"
    with pytest.raises(KeyError, match="attn"):
        tl._show_problem(_never_called, "attn")
    with pytest.raises(ValueError, match="batch"):
        tl.show(_attn_builder, 0, 4096, 4096, 32, 8, 128, False)
    with pytest.raises(ValueError, match="seq_k"):
        tl.show(_attn_builder, 4, 4096, -1, 32, 8, 128, False)
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tl.show(_attn_builder, 4, 4096, 4096, 32, 8, 128, False, ctas=[0, 1], path=None) is None
    assert capsys.readouterr().out.strip() == tl.NO_GPU
