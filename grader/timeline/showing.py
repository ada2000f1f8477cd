"""A builder's timeline in one call (``show``): build the traced kernel, run it once on the GPU,
decode, summarize and draw. ``grader.build`` and ``grader.problems`` (and torch, TVM) are
imported inside the functions that need them: importing ``grader.timeline`` imports none of them."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from .decoding import Event, decode
from .drawing import draw, summarize


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
    from .. import problems
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
    from .. import build
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
