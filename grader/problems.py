"""Kernel problems, declared once: what a lab's GPU kernel must compute, how it is called, how
its answer is checked and what its speed is compared with.

A :class:`Problem` holds no grading logic; grader/runners.py runs every problem the same way
(seeded inputs, NaN-poisoned outputs, a float64 reference, a tolerance, a same-run baseline).
A lab's spec names the problem of each kernel part (``params.problem``) and its builders; a new
lab with a kernel of a known kind adds spec data, not code.

The arguments of a timed call come from ``make_inputs`` (one case index per argument set: the
speed runner rotates several sets of one shape between timed calls), and every buffer a timed
call writes is poisoned before the call (``make_outputs``, ``Timed.outputs``).

Problems (the argument order of the kernel call is ``Problem.call``):

- ``scale_add`` (Lab 1): ``out = alpha * x + y`` over fp16 vectors of length n;
  ``kernel(x, y, out, alpha)``, alpha an fp32 scalar; baseline: a device copy of x.
- ``affine`` (Lab 2, the TMA tile kernel and the pipelined stream): ``out = alpha * x + beta``
  over an fp16 (M, N) tensor; ``kernel(x, out, alpha, beta)``; baseline: a device copy of x.
  ``affine_ring``: the same, each case with a ring depth of its own (fields M, N, stages), for the
  stream's correctness at any depth.
- ``transpose`` (Lab 3): ``b = a.T`` for fp16 a of shape (m, n); ``kernel(a, b)``; baseline: a
  device copy of a; ``torch .t().contiguous()`` timed beside it.
- ``gemm`` (Lab 5): ``D = A @ B.T``, A [M, K], B [N, K] (both K-major), fp16 in, fp32
  accumulation, fp16 out; ``kernel(A, B, D)``; baseline: ``torch.matmul(A, B.T)``.
- ``gemm_nn`` (Lab 4): ``D = A @ B``, A [M, K], B [K, N] (B N-major), otherwise as ``gemm``;
  baseline: ``torch.matmul(A, B)``.
- ``attention`` (Lab 6): attention forward with grouped-query heads; ``kernel(Q, K, V, O, LSE)``;
  see :func:`attention_reference` and :func:`attention_tolerances`; baseline: SDPA with the cuDNN
  backend (FLASH timed beside it).

Shapes: a spec writes a shape as a list in the order of ``Problem.fields`` or as a table keyed by
field name; :meth:`Problem.shape` turns either into the problem's named tuple. Hidden shapes are
drawn field by field: from ``hidden_choices[field]`` when the spec gives a list of choices, else a
multiple of ``granule[field]`` up to ``hidden_max[field]`` (lists in field order or tables).

Attention (Lab 6)
-----------------
Layout [batch, seq, heads, head_dim], fp16. Q [B, Sq, Hq, D], K and V [B, Sk, Hkv, D],
Hq = group * Hkv (group 1 is multi-head attention, Hkv = 1 multi-query attention); query head h
reads key/value head ``h // group`` (as SDPA's ``enable_gqa`` and FlashAttention do). Softmax
scale 1/sqrt(D). Outputs O [B, Sq, Hq, D] fp16 and LSE [B, Hq, Sq] fp32, the natural-log
log-sum-exp of each row's scaled logits. Causal masking is aligned bottom-right, as in
FlashAttention: query i sees key j iff ``j <= i + Sk - Sq`` (SDPA's ``is_causal`` aligns top-left;
the two agree only when Sq == Sk). A row that sees no key (causal with Sq > Sk, rows
i < Sq - Sk) has O = 0 and LSE = -inf (FlashAttention 2 itself stores +inf there; the course asks
for the mathematical value, log 0). The builder is called as
``builder(batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal)``. A shape may carry
``q_scale`` (default 1): Q is drawn as ``q_scale * randn`` before rounding to fp16, which spreads
the logits (N(0, q_scale^2) for random inputs), so that a kernel without the running-max
subtraction overflows; the builder is not told.

The tolerance of attention (``attention_tolerances``)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
O_i = sum_j w_ij V_j with weights w_ij = p_ij / l_i, p_ij = exp(s_ij - m_i), l_i = sum_j p_ij:
a convex combination of the rows of V, not a K-term sum of arbitrary terms, so its error is set by
the relative errors of the weights, not by the number of keys. With u = 2^-11 (fp16 unit
roundoff), u32 = 2^-24, R the largest spread (max - min over keys) of a column of V and
Vmax = max |V|:

1. Lemma. If every weight changes by a relative error of at most e and the weights still sum to
   one, sum_j |w~_ij - w_ij| <= 2e and, because sum_j (w~_ij - w_ij) = 0,
   ``|sum_j (w~_ij - w_ij) V_jd| = |sum_j (w~_ij - w_ij)(V_jd - c)| <= 2e · R/2 = e·R``
   (c the middle of the column's range). If instead only the numerator changes (the weights no
   longer sum to one), the change is at most e · sum_j w_ij |V_jd| <= e·Vmax.
2. P rounded to fp16 for the P·V product (every FlashAttention kernel does this): a relative
   error of at most u per p_ij, in the numerator only (l summed in fp32 from unrounded p) or in
   both (l summed from the rounded P): at most u·max(R, Vmax).
3. exp2 evaluated approximately (MUFU ex2 is within 2^-22; FA4's FMA polynomial is meant to stay
   under fp16's rounding), allowed up to u of relative error per p_ij, in numerator and l alike:
   at most u·R.
4. Logits s_ij computed in fp32 from fp16 Q and K: the products are exact in fp32 and the D-term
   sum errs by at most ``ds = scale · D · u32 · max_i |q_i| · max_j |k_j|`` (Euclidean norms:
   the classic bound of recursive summation, with Cauchy-Schwarz). That is a relative error ds of
   every p_ij, in numerator and l alike: at most ds·R; and it shifts the LSE by at most ds.
5. fp32 accumulation of P·V and of l over key blocks of Bk >= 64 keys: at most (Bk + Sk/Bk)·u32
   relative to sum_j w_ij |V_jd|, below u/2 for seq_k <= 2^18: allowed as (u/2)·Vmax.
6. O rounded to fp16 once at the end: at most u·|O|; the LSE kept in fp32: u32·|LSE|.

So ``|O - O_ref| <= (2u + ds)·max(R, Vmax) + (u/2)·Vmax + 4u·|O_ref|`` (rtol 4u leaves a factor
4 on the final rounding) and ``|LSE - LSE_ref| <= 2u + ds + u/2 + 4·u32·|LSE_ref|`` (l's relative
error of at most 2u becomes an absolute error of log l). For standard-normal inputs and D = 128
this is an absolute tolerance of about 0.01 on O (the book checks with rtol = atol = 1e-2) and
1.3e-3 on the LSE, whatever seq_k is; a simulated FlashAttention forward with fp16 P errs 10 to
100 times less (tests/grader/test_problems.py). Subnormal fp16 P (p < 2^-14) carries an absolute
rounding error of at most 2^-25 per key, unbiased, about sqrt(Sk)·2^-25 in total: negligible for
the course's inputs.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import random
from typing import Any, Callable, NamedTuple, Sequence

import torch

from . import compare, inputs
from .context import Work

U16 = 2.0 ** -11        # unit roundoff of fp16
U32 = 2.0 ** -24        # unit roundoff of fp32


# ---------------------------------------------------------------- declarations

@dataclasses.dataclass(frozen=True)
class Operand:
    """A tensor of the kernel call: its name, its shape as a function of the problem's shape,
    its dtype, and (inputs only) the factor the standard-normal draw is scaled by."""
    name: str
    dims: Callable[[Any], tuple[int, ...]]
    dtype: torch.dtype = torch.float16
    scale: Callable[[Any], float] | None = None


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A scalar argument, drawn uniformly in [low, high] and rounded to ``digits`` decimals for
    correctness cases (a speed part fixes it in ``params.scalars``). The kernel takes it as fp32,
    so the reference uses its fp32 value."""
    name: str
    low: float
    high: float
    digits: int = 3


@dataclasses.dataclass(frozen=True)
class Timed:
    """A torch callable timed beside the kernel, the work of one call, and the buffers it writes
    into (poisoned before each of its calls, as the kernel's outputs are: grader/timing.py)."""
    fn: Callable[[], Any]
    work: Work
    outputs: tuple[torch.Tensor, ...] = ()

    def poison(self) -> None:
        for t in self.outputs:
            t.fill_(float("nan"))


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    doc: str
    fields: tuple[str, ...]                      # the shape's named fields, in builder order
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    call: tuple[str, ...]                        # argument order of the kernel: operand/scalar names
    reference: Callable[..., dict[str, torch.Tensor]]   # (ins, scalars, shape, rows) -> float64 outputs
    tolerance: Callable[[Any, dict[str, torch.Tensor]], dict[str, compare.Tolerance]]
    work: Callable[[Any], Work]
    metric: str                                  # "bandwidth" or "flops"
    baseline_name: str
    baseline: Callable[..., Timed]               # (ins, scalars, shape) -> Timed
    extras: Callable[..., dict[str, Timed]] = lambda ins, scalars, shape: {}
    scalars: tuple[Scalar, ...] = ()
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    normalize: Callable[[dict], dict] = lambda d: d            # derived fields (e.g. group -> heads_q)
    validate: Callable[[Any], str | None] = lambda shape: None  # a message when the shape is invalid
    builder_fields: tuple[str, ...] | None = None              # default: every field
    label: Callable[[Any], str] | None = None
    # Sampled checks of large outputs (``check_rows`` in a speed part): the axis of each output
    # that the reference can restrict to a subset of rows, and the extent of that axis.
    row_axis: dict[str, int] = dataclasses.field(default_factory=dict)
    row_extent: Callable[[Any], int] | None = None

    def __post_init__(self):
        names = {o.name for o in self.inputs} | {o.name for o in self.outputs} | {s.name for s in self.scalars}
        missing = [a for a in self.call if a not in names]
        if missing:
            raise ValueError(f"problem {self.name}: call names unknown arguments {missing}")
        object.__setattr__(self, "shape_type", collections.namedtuple(f"{self.name}_shape", self.fields))

    # ---- shapes

    def shape(self, raw) -> NamedTuple:
        """A spec's shape (a list in field order, or a table by field name) as a named tuple."""
        if isinstance(raw, dict):
            d = self.normalize(dict(raw))
            unknown = set(d) - set(self.fields)
            if unknown:
                raise ValueError(f"problem {self.name}: unknown shape fields {sorted(unknown)} "
                                 f"(fields: {', '.join(self.fields)})")
            d = {**self.defaults, **d}
        else:
            raw = list(raw)
            if len(raw) > len(self.fields):
                raise ValueError(f"problem {self.name}: shape {raw} has more than the {len(self.fields)} "
                                 f"fields {', '.join(self.fields)}")
            d = {**self.defaults, **dict(zip(self.fields, raw))}
        missing = [f for f in self.fields if f not in d]
        if missing:
            raise ValueError(f"problem {self.name}: shape {raw!r} lacks {missing}")
        shape = self.shape_type(**{f: d[f] for f in self.fields})
        bad = self.validate(shape)
        if bad:
            raise ValueError(f"problem {self.name}: invalid shape {self.describe(shape)}: {bad}")
        return shape

    def builder_args(self, shape) -> tuple:
        """The builder's positional arguments for ``shape`` (plain ints and bools)."""
        fields = self.builder_fields or self.fields
        return tuple(_plain(getattr(shape, f)) for f in fields)

    def describe(self, shape) -> str:
        if self.label is not None:
            return self.label(shape)
        return "x".join(str(v) for v in shape)

    def draw_shape(self, r: random.Random, params: dict):
        """A hidden shape: per field, a choice from ``hidden_choices`` or a multiple of
        ``granule`` up to ``hidden_max``; fields in neither keep their default."""
        choices = params.get("hidden_choices", {})
        granule = self._per_field(params.get("granule"))
        top = self._per_field(params.get("hidden_max"))
        d = {}
        for f in self.fields + tuple(k for k in choices if k not in self.fields):
            if f in choices:
                d[f] = r.choice(list(choices[f]))
            elif f in granule and f in top:
                g = int(granule[f])
                d[f] = g * r.randint(1, int(top[f]) // g)
        return self.shape(d)

    def _per_field(self, v) -> dict:
        if v is None:
            return {}
        if isinstance(v, dict):
            return dict(v)
        if isinstance(v, (int, float)):
            return {f: v for f in self.fields}
        return dict(zip(self.fields, v))

    # ---- tensors

    def make_inputs(self, lab: str, part: str, shape, seed: int, case: int, device: str) -> dict[str, torch.Tensor]:
        """Seeded standard-normal inputs; input k of case i has index ``len(inputs) * i + k``."""
        out = {}
        n = len(self.inputs)
        for k, op in enumerate(self.inputs):
            dims = tuple(op.dims(shape))
            index = n * case + k
            scale = op.scale(shape) if op.scale else 1.0
            if scale == 1.0:
                t = inputs.randn(lab, part, dims, seed, op.dtype, device, index=index)
            else:
                t = (inputs.randn(lab, part, dims, seed, torch.float32, device, index=index) * scale).to(op.dtype)
            out[op.name] = t
        return out

    def make_outputs(self, shape, device: str, guarded: bool = False) -> dict[str, torch.Tensor]:
        """Output buffers filled with NaN, so that every element left unwritten shows up; with
        ``guarded``, each lies between two guard bands (``guarded_empty``) that ``outside_writes``
        reads after the call."""
        make = guarded_empty if guarded else (lambda dims, dtype, dev: torch.empty(dims, dtype=dtype, device=dev))
        outs = {op.name: make(tuple(op.dims(shape)), op.dtype, device) for op in self.outputs}
        for t in outs.values():
            t.fill_(float("nan"))
        return outs

    def draw_scalars(self, lab: str, part: str, seed: int, case: int) -> dict[str, float]:
        if not self.scalars:
            return {}
        r = inputs.rng(lab, f"{part}-scalars{case}", seed)
        return {s.name: round(r.uniform(s.low, s.high), s.digits) for s in self.scalars}

    def args(self, tensors: dict[str, torch.Tensor], scalars: dict[str, float]) -> list:
        """The kernel's arguments in call order."""
        return [tensors[a] if a in tensors else scalars[a] for a in self.call]


# ---------------------------------------------------------------- writes outside an output
#
# A kernel whose edge tiles are not clipped (a row past M, a column chunk past N) stores past the
# end of its output. Past the last row that is memory the kernel was not given: it can fault,
# land in another tensor, or land nowhere anyone looks. Correctness cases therefore hand the
# kernel each output as a view into a larger buffer whose GUARD_BYTES before and after it hold
# the byte GUARD_BYTE, and read those bands back after the call.

GUARD_BYTES = 1 << 18          # per side; a multiple of 1024, so the output keeps its alignment
GUARD_BYTE = 0xA5


def guarded_empty(dims, dtype: torch.dtype, device: str) -> torch.Tensor:
    """An uninitialised tensor of ``dims`` inside a buffer with a guard band on either side."""
    n = math.prod(dims)
    size = torch.empty((), dtype=dtype).element_size()
    pad = GUARD_BYTES // size
    buf = torch.empty(2 * pad + n, dtype=dtype, device=device)
    buf.view(torch.uint8).fill_(GUARD_BYTE)
    out = buf[pad:pad + n].view(dims)
    out._grader_guard = (buf, pad)
    return out


def outside_writes(name: str, out: torch.Tensor) -> str | None:
    """What a call wrote in the guard bands around ``out`` (made by ``guarded_empty``), or None."""
    guard = getattr(out, "_grader_guard", None)
    if guard is None:
        return None
    buf, pad = guard
    raw = buf.view(torch.uint8)
    band = pad * buf.element_size()
    before = (raw[:band] != GUARD_BYTE).nonzero().flatten()
    after = (raw[raw.numel() - band:] != GUARD_BYTE).nonzero().flatten()
    said = []
    if before.numel():
        said.append(f"{before.numel()} bytes before its start changed (the nearest at byte "
                    f"-{band - int(before[-1])})")
    if after.numel():
        said.append(f"{after.numel()} bytes after its end changed (the first at byte +{int(after[0])} past the end)")
    if not said:
        return None
    return (f"the kernel wrote outside its output {name}: " + "; ".join(said) + " (of the " +
            f"{GUARD_BYTES} watched on each side; e.g. a store with no bound in an edge tile)")


def _plain(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def fp32(x: float) -> float:
    """A Python float as the fp32 scalar the kernel receives."""
    return float(torch.tensor(x, dtype=torch.float32))


def _copy_baseline(src: str) -> Callable[..., Timed]:
    def make(ins, scalars, shape) -> Timed:
        x = ins[src]
        dst = torch.empty_like(x)
        return Timed(lambda: dst.copy_(x), Work(bytes=2 * x.numel() * x.element_size()), (dst,))
    return make


# ---------------------------------------------------------------- Lab 1: scale_add

SCALE_ADD = Problem(
    name="scale_add",
    doc="out = alpha * x + y over fp16 vectors of length n (alpha fp32); kernel(x, y, out, alpha)",
    fields=("n",),
    inputs=(Operand("x", lambda s: (s.n,)), Operand("y", lambda s: (s.n,))),
    outputs=(Operand("out", lambda s: (s.n,)),),
    scalars=(Scalar("alpha", -3.0, 3.0),),
    call=("x", "y", "out", "alpha"),
    reference=lambda ins, sc, shape, rows=None: {"out": fp32(sc["alpha"]) * ins["x"].double() + ins["y"].double()},
    tolerance=lambda shape, ins: {"out": compare.tolerance(torch.float16)},
    work=lambda s: Work(bytes=3 * s.n * 2),            # read x and y, write out
    metric="bandwidth",
    baseline_name="copy",
    baseline=_copy_baseline("x"),
    label=lambda s: f"n={s.n}",
)


# ---------------------------------------------------------------- Lab 2: affine (tile kernel, stream)

AFFINE = Problem(
    name="affine",
    doc="out = alpha * x + beta over an fp16 (M, N) tensor; kernel(x, out, alpha, beta)",
    fields=("M", "N"),
    inputs=(Operand("x", lambda s: (s.M, s.N)),),
    outputs=(Operand("out", lambda s: (s.M, s.N)),),
    scalars=(Scalar("alpha", -3.0, 3.0), Scalar("beta", -2.0, 2.0)),
    call=("x", "out", "alpha", "beta"),
    reference=lambda ins, sc, shape, rows=None: {"out": fp32(sc["alpha"]) * ins["x"].double() + fp32(sc["beta"])},
    tolerance=lambda shape, ins: {"out": compare.tolerance(torch.float16)},
    work=lambda s: Work(bytes=2 * s.M * s.N * 2),       # read x once, write out once
    metric="bandwidth",
    baseline_name="copy",
    baseline=_copy_baseline("x"),
)

# The stream of Lab 2 part e at a ring depth of each case's own: its builder takes the depth as its
# third argument, build_tma_stream(M, N, stages), so that a ring written for one depth fails.
AFFINE_RING = dataclasses.replace(
    AFFINE, name="affine_ring", fields=("M", "N", "stages"),
    doc="out = alpha * x + beta as affine, built with a ring of `stages` stages; kernel(x, out, alpha, beta)",
    label=lambda s: f"{s.M}x{s.N}, {s.stages} stage{'s' if s.stages != 1 else ''}")


# ---------------------------------------------------------------- Lab 3: transpose

def _transpose_extras(ins, scalars, shape) -> dict[str, Timed]:
    a = ins["a"]
    return {"torch": Timed(lambda: a.t().contiguous(), Work(bytes=2 * a.numel() * a.element_size()))}


TRANSPOSE = Problem(
    name="transpose",
    doc="b = a.T for fp16 a of shape (m, n); kernel(a, b)",
    fields=("m", "n"),
    inputs=(Operand("a", lambda s: (s.m, s.n)),),
    outputs=(Operand("b", lambda s: (s.n, s.m)),),
    call=("a", "b"),
    reference=lambda ins, sc, shape, rows=None: {"b": ins["a"].t().double()},
    tolerance=lambda shape, ins: {"b": compare.tolerance(torch.float16)},
    work=lambda s: Work(bytes=2 * s.m * s.n * 2),       # every element read once and written once
    metric="bandwidth",
    baseline_name="copy",
    baseline=_copy_baseline("a"),
    extras=_transpose_extras,
)


# ---------------------------------------------------------------- Labs 4 and 5: gemm, gemm_nn

def _b_operand(B: torch.Tensor, b_is_nk: bool) -> torch.Tensor:
    """The K x N right-hand side of D = A @ _: B [N, K] transposed (``gemm``), B [K, N] as it is
    (``gemm_nn``)."""
    return B.T if b_is_nk else B


def _gemm_reference(b_is_nk: bool):
    def reference(ins, scalars, shape, rows=None) -> dict[str, torch.Tensor]:
        A = ins["A"] if rows is None else ins["A"].index_select(0, rows)
        return {"D": A.double() @ _b_operand(ins["B"].double(), b_is_nk)}
    return reference


def gemm_tolerance(shape, ins) -> dict[str, compare.Tolerance]:
    return {"D": compare.tolerance(torch.float16, shape.K, magnitude=math.sqrt(shape.K))}


def gemm_work(s) -> Work:
    return Work(bytes=2 * (s.M * s.K + s.N * s.K + s.M * s.N), flops=2 * s.M * s.N * s.K)


def _gemm_baseline(b_is_nk: bool):
    def baseline(ins, scalars, shape) -> Timed:
        A, B = ins["A"], _b_operand(ins["B"], b_is_nk)
        D = torch.empty(shape.M, shape.N, dtype=torch.float16, device=A.device)
        return Timed(lambda: torch.matmul(A, B, out=D), gemm_work(shape), (D,))
    return baseline


GEMM = Problem(
    name="gemm",
    doc="D = A @ B.T, A [M, K], B [N, K], fp16 in, fp32 accumulation, fp16 out; kernel(A, B, D)",
    fields=("M", "N", "K"),
    inputs=(Operand("A", lambda s: (s.M, s.K)), Operand("B", lambda s: (s.N, s.K))),
    outputs=(Operand("D", lambda s: (s.M, s.N)),),
    call=("A", "B", "D"),
    reference=_gemm_reference(b_is_nk=True),
    tolerance=gemm_tolerance,
    work=gemm_work,
    metric="flops",
    baseline_name="torch.matmul",
    baseline=_gemm_baseline(b_is_nk=True),
    row_axis={"D": 0},
    row_extent=lambda s: s.M,
)

GEMM_NN = dataclasses.replace(
    GEMM,
    name="gemm_nn",
    doc="D = A @ B, A [M, K], B [K, N] (N-major), fp16 in, fp32 accumulation, fp16 out; kernel(A, B, D)",
    inputs=(Operand("A", lambda s: (s.M, s.K)), Operand("B", lambda s: (s.K, s.N))),
    reference=_gemm_reference(b_is_nk=False),
    baseline=_gemm_baseline(b_is_nk=False),
)


# ---------------------------------------------------------------- Lab 6: attention with GQA

def visible_pairs(seq_q: int, seq_k: int, causal: bool) -> int:
    """(query, key) pairs a bottom-right-aligned causal mask leaves visible, per head: query i
    sees keys 0 .. i + seq_k - seq_q, i.e. max(0, i + seq_k - seq_q + 1) of them (the last query
    sees all seq_k keys; when seq_q > seq_k the first seq_q - seq_k queries see none)."""
    if not causal:
        return seq_q * seq_k
    # the counts of the rows that see a key run through a, a + 1, ..., seq_k
    a = max(seq_k - seq_q + 1, 1)
    return (seq_k * (seq_k + 1) - (a - 1) * a) // 2


def attention_flops(s) -> int:
    """4 · D per visible (query, key) pair and query head: 2 for Q·K^T, 2 for P·V."""
    return 4 * s.batch * s.heads_q * s.head_dim * visible_pairs(s.seq_q, s.seq_k, s.causal)


def attention_work(s) -> Work:
    elems_q = s.batch * s.seq_q * s.heads_q * s.head_dim
    elems_kv = s.batch * s.seq_k * s.heads_kv * s.head_dim
    return Work(bytes=2 * (2 * elems_q + 2 * elems_kv) + 4 * s.batch * s.heads_q * s.seq_q,
                flops=attention_flops(s))


def causal_mask(seq_q: int, seq_k: int, device=None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[len(rows) or seq_q, seq_k] bool, True where query i may see key j (bottom-right aligned)."""
    i = torch.arange(seq_q, device=device) if rows is None else rows.to(device)
    j = torch.arange(seq_k, device=device)
    return j[None, :] <= i[:, None] + (seq_k - seq_q)


def attention_reference(ins, scalars=None, shape=None, rows: torch.Tensor | None = None,
                        causal: bool | None = None, max_chunk: int = 1 << 24) -> dict[str, torch.Tensor]:
    """float64 O [B, Sq', Hq, D] and LSE [B, Hq, Sq'] (Sq' = len(rows) when query rows are
    sampled), computed per (batch, key/value head) and in blocks of query rows so that no block's
    logits exceed ``max_chunk`` elements."""
    q, k, v = ins["Q"], ins["K"], ins["V"]
    if causal is None:
        causal = bool(shape.causal)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if Hq % Hkv:
        raise ValueError(f"heads_q = {Hq} is not a multiple of heads_kv = {Hkv}")
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D)
    qrows = torch.arange(Sq, device=q.device) if rows is None else rows.to(q.device)
    n = qrows.numel()
    O = torch.zeros(B, n, Hq, D, dtype=torch.float64, device=q.device)
    LSE = torch.full((B, Hq, n), -math.inf, dtype=torch.float64, device=q.device)
    step = max(1, max_chunk // max(1, g * Sk))
    for b in range(B):
        for hk in range(Hkv):
            kk = k[b, :, hk].double()                         # [Sk, D]
            vv = v[b, :, hk].double()
            heads = slice(hk * g, (hk + 1) * g)
            for r0 in range(0, n, step):
                rr = qrows[r0:r0 + step]
                qq = q[b].index_select(0, rr)[:, heads].double()        # [r, g, D]
                s = torch.einsum("rgd,kd->grk", qq, kk) * scale           # [g, r, Sk]
                if causal:
                    s = s.masked_fill(~causal_mask(Sq, Sk, q.device, rr)[None], -math.inf)
                m = s.amax(dim=-1, keepdim=True)
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                p = torch.exp(s - m)                                      # 0 where masked
                l = p.sum(dim=-1, keepdim=True)                           # [g, r, 1]
                o = (p @ vv) / torch.where(l > 0, l, torch.ones_like(l))  # 0 for rows with no key
                lse = torch.where(l > 0, m + torch.log(torch.where(l > 0, l, torch.ones_like(l))),
                                  torch.full_like(l, -math.inf))
                O[b, r0:r0 + step, heads] = o.permute(1, 0, 2)
                LSE[b, heads, r0:r0 + step] = lse[..., 0]
    return {"O": O, "LSE": LSE}


def attention_tolerances(ins, head_dim: int | None = None) -> dict[str, compare.Tolerance]:
    """The rule derived in this module's docstring, from the inputs themselves: the largest
    column spread R and largest magnitude of V, and the fp32 logit error bound ds."""
    q, k, v = ins["Q"], ins["K"], ins["V"]
    D = head_dim or q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    vd = v.double()
    spread = float((vd.amax(dim=1) - vd.amin(dim=1)).max()) if v.shape[1] else 0.0
    vmax = float(vd.abs().max()) if v.numel() else 0.0
    qn = float(q.double().norm(dim=-1).max()) if q.numel() else 0.0
    kn = float(k.double().norm(dim=-1).max()) if k.numel() else 0.0
    ds = scale * D * U32 * qn * kn
    return {
        "O": compare.Tolerance(rtol=4 * U16, atol=(2 * U16 + ds) * max(spread, vmax) + 0.5 * U16 * vmax),
        "LSE": compare.Tolerance(rtol=4 * U32, atol=2 * U16 + ds + 0.5 * U16),
    }


def _sdpa_views(ins):
    """[B, H, S, D] contiguous copies for SDPA, made once (outside the timed calls)."""
    return tuple(ins[n].transpose(1, 2).contiguous() for n in ("Q", "K", "V"))


def _sdpa(backend_name: str, ins, shape) -> Callable[[], Any]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    q, k, v = _sdpa_views(ins)
    kwargs: dict[str, Any] = {"enable_gqa": True}
    if shape.causal and shape.seq_q == shape.seq_k:
        kwargs["is_causal"] = True
    elif shape.causal:
        # SDPA's is_causal aligns top-left; this bias aligns bottom-right as the problem does.
        # cuDNN may reject it: time speed shapes with seq_q == seq_k.
        from torch.nn.attention.bias import causal_lower_right
        kwargs["attn_mask"] = causal_lower_right(shape.seq_q, shape.seq_k)

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return run


def _attention_baseline(ins, scalars, shape) -> Timed:
    return Timed(_sdpa("CUDNN_ATTENTION", ins, shape), attention_work(shape))


def _attention_extras(ins, scalars, shape) -> dict[str, Timed]:
    return {"sdpa_flash": Timed(_sdpa("FLASH_ATTENTION", ins, shape), attention_work(shape))}


def _attention_normalize(d: dict) -> dict:
    if "group" in d:
        g = d.pop("group")
        if "heads_q" not in d:
            if "heads_kv" not in d:
                raise ValueError("an attention shape with `group` needs `heads_kv`")
            d["heads_q"] = int(g) * int(d["heads_kv"])
    return d


def _attention_validate(s) -> str | None:
    for f in ("batch", "seq_q", "seq_k", "heads_q", "heads_kv", "head_dim"):
        if not isinstance(getattr(s, f), int) or getattr(s, f) < 1:
            return f"{f} must be a positive integer"
    if s.heads_q % s.heads_kv:
        return f"heads_q = {s.heads_q} is not a multiple of heads_kv = {s.heads_kv}"
    if s.head_dim not in (64, 128):
        return f"head_dim must be 128 (or 64), not {s.head_dim}"
    if not isinstance(s.causal, bool):
        return "causal must be true or false"
    return None


def _attention_label(s) -> str:
    kind = "MQA" if s.heads_kv == 1 else f"group {s.heads_q // s.heads_kv}"
    extra = f", q_scale={s.q_scale:g}" if s.q_scale != 1 else ""
    return (f"B={s.batch} Sq={s.seq_q} Sk={s.seq_k} Hq={s.heads_q} Hkv={s.heads_kv} ({kind}) "
            f"D={s.head_dim} {'causal' if s.causal else 'non-causal'}{extra}")


ATTENTION = Problem(
    name="attention",
    doc=("attention forward with GQA: Q [B, Sq, Hq, D], K, V [B, Sk, Hkv, D] fp16 -> O [B, Sq, Hq, D] fp16, "
         "LSE [B, Hq, Sq] fp32 (natural log), scale 1/sqrt(D), causal bottom-right; kernel(Q, K, V, O, LSE)"),
    fields=("batch", "seq_q", "seq_k", "heads_q", "heads_kv", "head_dim", "causal", "q_scale"),
    defaults={"head_dim": 128, "causal": False, "q_scale": 1.0},
    normalize=_attention_normalize,
    validate=_attention_validate,
    builder_fields=("batch", "seq_q", "seq_k", "heads_q", "heads_kv", "head_dim", "causal"),
    inputs=(Operand("Q", lambda s: (s.batch, s.seq_q, s.heads_q, s.head_dim), scale=lambda s: float(s.q_scale)),
            Operand("K", lambda s: (s.batch, s.seq_k, s.heads_kv, s.head_dim)),
            Operand("V", lambda s: (s.batch, s.seq_k, s.heads_kv, s.head_dim))),
    outputs=(Operand("O", lambda s: (s.batch, s.seq_q, s.heads_q, s.head_dim)),
             Operand("LSE", lambda s: (s.batch, s.heads_q, s.seq_q), torch.float32)),
    call=("Q", "K", "V", "O", "LSE"),
    reference=lambda ins, sc, shape, rows=None: attention_reference(ins, sc, shape, rows),
    tolerance=lambda shape, ins: attention_tolerances(ins, shape.head_dim),
    work=attention_work,
    metric="flops",
    baseline_name="sdpa_cudnn",
    baseline=_attention_baseline,
    extras=_attention_extras,
    label=_attention_label,
    row_axis={"O": 1, "LSE": 2},
    row_extent=lambda s: s.seq_q,
)


PROBLEMS: dict[str, Problem] = {p.name: p for p in (SCALE_ADD, AFFINE, AFFINE_RING, TRANSPOSE, GEMM, GEMM_NN, ATTENTION)}


def get(name: str) -> Problem:
    try:
        return PROBLEMS[name]
    except KeyError:
        raise KeyError(f"no kernel problem {name!r}; problems: {', '.join(PROBLEMS)}") from None


def shapes_of(problem: Problem, raw: Sequence) -> list:
    return [problem.shape(s) for s in raw]
