"""TensorFlow's own matmul rate on one GPT training step's own products: the limit of a CPU step.

Every matrix product of one training step of dtcli's GPT (bias-free, tied head, MLP 4x wide)
at the given shape: per layer the forward q, k, v and attention-out projections, the MLP's up
and down projections, attention's two batched products per head (scores Q K^T and the weighted
sum A V), the tied output head once, and each product's backward: the input gradient dY W^T and
the weight gradient X^T dY (attention's batched ones likewise: dS K, dS^T Q, dO V^T, A^T dO), as
TensorFlow's MatMul and BatchMatMul gradients call them (transpose flags included). Identical
shapes are grouped, and each is timed with tf.matmul in a tf.function twice: without XLA
(TensorFlow's oneDNN kernels, what dtcli's DTensor path runs) and with jit_compile=True (XLA's
dots, what dtcli's one-device XLA path runs), in float32 and bf16 (`--dtype`), one fresh process
per thread count whose CPU affinity is that many cores (as bench/nanogpt.py's runs; TensorFlow
sizes its pools from them, OMP/MKL_NUM_THREADS are set to it). Each call computes several copies
of a product, each on its OWN input tensors: products of the same inputs in one tf.function are
merged by common-subexpression elimination and read as many times too fast.

    python bench/matmul_limit.py                          # GPT-2 small body, bytes, 2 and 1 threads
    python bench/matmul_limit.py --threads 2 --dtype float32 bf16 --vocab 50304
    python bench/matmul_limit.py --threads 2 --step-ms 1706          # a measured step against it
    python bench/matmul_limit.py --threads 2 1 --dtype float32 bf16 --nanogpt-json gpt2.txt

Per shape: `m x k x n` ([m, k] x [k, n]; `B*` a batch of B such products; `^T` an operand
stored transposed), the roles it plays, how many a step runs, their GFLOP per step and each
path's GFLOP/s (a sanity bound: a core does at most its FMA width x 2 x clock, ~150-200 GFLOP/s
on an AVX-512 core in float32; a rate far above threads x that is a measuring error). Totals:
the step's matmul FLOPs; the FLOP-weighted rate of each path, total FLOPs / sum(FLOPs_i /
rate_i), and `best`, each shape at its faster path's rate; the time the products alone take;
and the step's FLOPs by nanoGPT's formula (dtcli.models.transformer.flops_per_token x tokens),
which counts the same products plus 6 FLOPs per token per LayerNorm weight.

The limit is the products alone. A step also does the elementwise work (LayerNorms, GELU,
residual adds, the causal mask, attention's softmax, the cross-entropy and their gradients),
the gradient norm and clipping, the AdamW update, and the data feed and host loop: none of them
is in the limit, all of them are in a measured step. `--step-ms X` (a measured ms/step at this
shape) prints the step's FLOP/s (nanoGPT's formula) over each weighted rate: the issue's
"against the limit" figure (the oneDNN column, TensorFlow's own matmul rate). `--nanogpt-json
FILE` reads bench/nanogpt.py's output (its last JSON line) and prints that ratio for each of its
rows at this shape and vocabulary, at the row's threads, bf16 rows against the bf16 rate.
Prints a table per thread count and dtype and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("onednn", "xla")  # tf.function without XLA, and with jit_compile=True
DTYPES = ("float32", "bf16")
# A call computes copies of a product until it holds this much work (a few ms, so that the
# call's own overhead stays small), within MAX_COPIES and this many bytes of distinct inputs.
CALL_FLOPS, MAX_COPIES, INPUT_BYTES = 2e9, 32, 1 << 29


@dataclasses.dataclass(frozen=True)
class Product:
    """`batch` products [m, k] x [k, n]; the first operand stored [k, m] (transpose_a) or the
    second [n, k] (transpose_b) as the gradients of MatMul and BatchMatMulV2 call them."""

    batch: int
    m: int
    k: int
    n: int
    transpose_a: bool = False
    transpose_b: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    def label(self) -> str:
        a = "^T" if self.transpose_a else ""
        b = "^T" if self.transpose_b else ""
        batch = f"{self.batch}*" if self.batch > 1 else ""
        return f"{batch}{self.m}x{self.k}{a} . {self.k}x{self.n}{b}"

    def operand_shapes(self) -> tuple[list[int], list[int]]:
        a = [self.k, self.m] if self.transpose_a else [self.m, self.k]
        b = [self.n, self.k] if self.transpose_b else [self.k, self.n]
        lead = [self.batch] if self.batch > 1 else []
        return lead + a, lead + b


@dataclasses.dataclass(frozen=True)
class Shape:
    """The GPT's shape and one step's batch."""

    layers: int
    width: int
    heads: int
    context: int
    batch: int
    vocab: int
    mlp_ratio: int = 4

    @property
    def tokens(self) -> int:
        return self.batch * self.context


def dense(role: str, rows: int, d_in: int, d_out: int) -> list[tuple[str, Product]]:
    """Y = X W (X [rows, d_in]): the forward, dX = dY W^T, dW = X^T dY."""
    return [
        (f"{role} fwd", Product(1, rows, d_in, d_out)),
        (f"{role} dX", Product(1, rows, d_out, d_in, transpose_b=True)),
        (f"{role} dW", Product(1, d_in, rows, d_out, transpose_a=True)),
    ]


def attention(bh: int, t: int, head_dim: int) -> list[tuple[str, Product]]:
    """S = Q K^T and O = A V per head (bh = batch x heads) and their four gradients."""
    return [
        ("QK^T fwd", Product(bh, t, head_dim, t, transpose_b=True)),
        ("dQ = dS K", Product(bh, t, t, head_dim)),
        ("dK = dS^T Q", Product(bh, t, t, head_dim, transpose_a=True)),
        ("AV fwd", Product(bh, t, t, head_dim)),
        ("dA = dO V^T", Product(bh, t, head_dim, t, transpose_b=True)),
        ("dV = A^T dO", Product(bh, t, t, head_dim, transpose_a=True)),
    ]


def step_products(s: Shape) -> list[tuple[str, Product]]:
    """Every matrix product of one training step, (role, product), one entry per execution."""
    n, d, hidden = s.tokens, s.width, s.mlp_ratio * s.width
    block = dense("q/k/v/out", n, d, d) * 4
    block += dense("mlp up", n, d, hidden) + dense("mlp down", n, hidden, d)
    block += attention(s.batch * s.heads, s.context, d // s.heads)
    head = [  # logits = X E^T with the token table E [vocab, d]; dE = dlogits^T X
        ("head fwd", Product(1, n, d, s.vocab, transpose_b=True)),
        ("head dX", Product(1, n, s.vocab, d)),
        ("head dE", Product(1, s.vocab, n, d, transpose_a=True)),
    ]
    return block * s.layers + head


def grouped(products: list[tuple[str, Product]]) -> dict[Product, tuple[int, list[str]]]:
    """Each distinct product: how many a step runs, and its roles (in first-seen order)."""
    counts = collections.Counter(p for _, p in products)
    roles: dict[Product, list[str]] = {}
    for role, p in products:
        if role not in roles.setdefault(p, []):
            roles[p].append(role)
    return {p: (counts[p], roles[p]) for p in roles}


def step_flops(s: Shape) -> float:
    """The step's FLOPs by nanoGPT's formula (dtcli.models.transformer.flops_per_token)."""
    from dtcli.models.transformer import flops_per_token
    from dtcli.recipe import TransformerConfig

    cfg = TransformerConfig(
        layers=s.layers, d_model=s.width, heads=s.heads, context=s.context, mlp_ratio=s.mlp_ratio
    )
    return flops_per_token(cfg, s.vocab, s.context) * s.tokens


def measure(s: Shape, dtypes: list[str], seconds: float) -> list[dict]:
    """(In the worker process.) Each distinct product's GFLOP/s by path and dtype."""
    import tensorflow as tf

    out = []
    for p in grouped(step_products(s)):
        copies = max(1, min(MAX_COPIES, round(CALL_FLOPS / p.flops)))
        elements = sum(math.prod(shape) for shape in p.operand_shapes())
        copies = max(1, min(copies, INPUT_BYTES // (4 * elements)))
        for dtype in dtypes:
            inputs = [
                tf.cast(tf.random.normal(shape), tf.bfloat16 if dtype == "bf16" else tf.float32)
                for _ in range(copies)
                for shape in p.operand_shapes()
            ]
            for path in PATHS:
                per_call = _time_call(p, copies, inputs, path == "xla", seconds)
                rate = copies * p.flops / per_call / 1e9
                out.append({**dataclasses.asdict(p), "dtype": dtype, "path": path, "gflops": rate})
            del inputs
    return out


def _time_call(p: Product, copies: int, inputs: list, jit: bool, seconds: float) -> float:
    """The median seconds of one call computing `copies` products, each of its own inputs
    (never the same tensors twice: common-subexpression elimination would merge them), each
    after the last (a control dependency: TensorFlow's executor would otherwise run them side
    by side, which a step's chain of products cannot; XLA may drop it)."""
    import tensorflow as tf

    def products(*xs):
        outs: list = []
        for i in range(copies):  # one after another, as a step's dependent products run
            with tf.control_dependencies(outs[-1:]):
                a, b = xs[2 * i], xs[2 * i + 1]
                outs.append(
                    tf.linalg.matmul(a, b, transpose_a=p.transpose_a, transpose_b=p.transpose_b)
                )
        return outs

    call = tf.function(products, jit_compile=jit)
    for _ in range(2):  # the trace, the compile, the first allocations
        call(*inputs)
    times: list[float] = []
    while len(times) < 5 or sum(times) < seconds:  # eager CPU calls return when done
        start = time.perf_counter()
        call(*inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_worker(s: Shape, threads: int, dtypes: list[str], seconds: float) -> dict:
    """One fresh process on `threads` cores: its rates, by the parent's JSON line protocol."""
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    for key in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        env.pop(key, None)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = str(threads)
    mine = sorted(os.sched_getaffinity(0))
    args = [sys.executable, __file__, "--worker", *shape_args(s), "--threads", str(threads)]
    args += ["--seconds", str(seconds)]
    done = subprocess.run(
        [*args, "--dtype", *dtypes],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, mine[:threads]),
    )
    if done.returncode:
        raise SystemExit(f"the {threads}-thread worker failed:\n{done.stderr[-3000:]}")
    return {"threads": threads, "rates": json.loads(done.stdout.splitlines()[-1])}


def shape_args(s: Shape) -> list[str]:
    fields = ("layers", "width", "heads", "context", "batch", "vocab")
    return [arg for f in fields for arg in (f"--{f}", str(getattr(s, f)))]


def limits(s: Shape, rates: list[dict], dtype: str) -> dict:
    """The step's products at the measured rates: per shape, and FLOP-weighted totals."""
    fields = [f.name for f in dataclasses.fields(Product)]
    by_product = {
        (Product(**{f: r[f] for f in fields}), r["path"]): r["gflops"]
        for r in rates
        if r["dtype"] == dtype
    }
    shapes, seconds = [], dict.fromkeys((*PATHS, "best"), 0.0)
    for p, (count, roles) in grouped(step_products(s)).items():
        rate = {path: by_product[p, path] for path in PATHS}
        rate["best"] = max(rate.values())
        flops = count * p.flops
        for path in seconds:
            seconds[path] += flops / (rate[path] * 1e9)
        shapes.append(
            {"product": p.label(), "roles": roles, "count": count, "flops": flops, **rate}
        )
    total = sum(r["flops"] for r in shapes)
    weighted = {path: total / seconds[path] / 1e9 for path in seconds}
    return {
        "shapes": shapes,
        "matmul_flops": total,
        "step_flops": step_flops(s),
        "gflops": weighted,
        "matmul_ms": {path: 1000 * t for path, t in seconds.items()},
    }


def print_limits(threads: int, dtype: str, lim: dict, step_ms: float | None) -> None:
    print(f"\n{threads} thread(s), {dtype}")
    print(f"{'product':28s} {'roles':34s} {'/step':>5s} {'GFLOP':>7s} {'oneDNN':>7s} {'XLA':>7s}")
    for r in lim["shapes"]:
        print(
            f"{r['product']:28s} {', '.join(r['roles'])[:34]:34s} {r['count']:5d} "
            f"{r['flops'] / 1e9:7.2f} {r['onednn']:7.1f} {r['xla']:7.1f}"
        )
    g, ms = lim["gflops"], lim["matmul_ms"]
    print(
        f"matmuls {lim['matmul_flops'] / 1e9:.2f} GFLOP a step (nanoGPT's formula: "
        f"{lim['step_flops'] / 1e9:.2f}); FLOP-weighted GFLOP/s oneDNN {g['onednn']:.1f}, XLA "
        f"{g['xla']:.1f}, best {g['best']:.1f}; the products alone {ms['onednn']:.0f} / "
        f"{ms['xla']:.0f} / {ms['best']:.0f} ms"
    )
    if step_ms:
        print(f"a step of {step_ms:g} ms: {against(lim, step_ms)}")


def against(lim: dict, step_ms: float) -> str:
    """A measured step's FLOP/s (nanoGPT's formula) over each weighted matmul rate."""
    rate = lim["step_flops"] / (step_ms / 1000) / 1e9
    ratios = ", ".join(f"{rate / lim['gflops'][p]:.3f} of {p}" for p in (*PATHS, "best"))
    return f"{rate:.1f} GFLOP/s, {ratios}"


def nanogpt_rows(path: Path) -> list[dict]:
    """The rows of bench/nanogpt.py's JSON line (its last line that is one)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith('{"rows"')]
    if not lines:
        raise ValueError(f"no JSON line of bench/nanogpt.py in {path}")
    return json.loads(lines[-1])["rows"]


def row_ratios(s: Shape, rows: list[dict], results: dict) -> list[str]:
    """Each bench/nanogpt.py row at this shape: its step against the limit at its threads and
    dtype (a bf16 row against the bf16 products), or why it is left out."""
    out = []
    keys = ("layers", "width", "heads", "context", "batch", "vocab")
    for row in rows:
        name = f"{row['run']} (vocab {row.get('vocab')}, {row['threads']} threads)"
        dtype = "bf16" if "bf16" in row["run"] else "float32"
        lim = results.get((row["threads"], dtype))
        if any(row.get(k) != getattr(s, k) for k in keys):
            out.append(f"{name}: another shape or vocabulary, left out")
        elif lim is None:
            out.append(f"{name}: no {row['threads']}-thread {dtype} limit measured, left out")
        else:
            out.append(f"{name}, {row['ms_per_step']} ms: {against(lim, row['ms_per_step'])}")
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (
        ("layers", 12),
        ("width", 768),
        ("heads", 12),
        ("context", 128),
        ("batch", 4),
        ("vocab", 256),
    ):
        parser.add_argument(f"--{name}", type=int, default=default, help="default %(default)s")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[2, 1], help="one process each (default 2 1)"
    )
    parser.add_argument("--dtype", nargs="+", choices=DTYPES, default=["float32"])
    parser.add_argument(
        "--seconds", type=float, default=0.5, help="timed calls per shape and path, at least"
    )
    parser.add_argument("--step-ms", type=float, help="a measured step at this shape, in ms")
    parser.add_argument("--nanogpt-json", type=Path, help="bench/nanogpt.py's output")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("layers", "width", "heads", "context", "batch", "vocab"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: at least 1")
    if args.width % args.heads:
        parser.error(f"--width: a multiple of --heads ({args.heads})")
    usable = len(os.sched_getaffinity(0))
    if not 1 <= min(args.threads) <= max(args.threads) <= usable:
        parser.error(f"--threads: each from 1 to {usable}, the cores this process may use")
    if not 0 < args.seconds < float("inf"):
        parser.error("--seconds: above 0")
    if args.step_ms is not None and not 0 < args.step_ms < float("inf"):
        parser.error("--step-ms: milliseconds above 0")
    if args.nanogpt_json:
        try:
            args.rows = nanogpt_rows(args.nanogpt_json)
        except (OSError, ValueError) as e:
            parser.error(f"--nanogpt-json: {e}")
    return args


def main() -> None:
    args = parse_args()
    s = Shape(args.layers, args.width, args.heads, args.context, args.batch, args.vocab)
    if args.worker:
        print(json.dumps(measure(s, args.dtype, args.seconds)))
        return
    results = {}
    for threads in args.threads:
        rates = run_worker(s, threads, args.dtype, args.seconds)["rates"]
        for dtype in args.dtype:
            results[threads, dtype] = limits(s, rates, dtype)
            print_limits(threads, dtype, results[threads, dtype], args.step_ms)
    if args.nanogpt_json:
        print()
        for line in row_ratios(s, args.rows, results):
            print(line)
    table = [{"threads": t, "dtype": d, **lim} for (t, d), lim in results.items()]
    print(json.dumps({"shape": dataclasses.asdict(s), "limits": table}))


if __name__ == "__main__":
    main()
