#!/usr/bin/env python3
"""Kiln against onnxruntime on the CPU, on the same machine, in one command.

For each model of the zoo (/work/shared/zoo or $KILN_ZOO; default: every model in it, and
those Kiln refuses are skipped with a note naming Kiln's error), both run on the inputs of
one data set of the model (--data-set, default test_data_set_0; the transformers'
first data set is batch 1, sequence 128):

- onnxruntime: CPU session, graph optimisations on, intra_op_num_threads = --threads
  (default 2), inter_op_num_threads = 1;
- Kiln: `kiln bench MODEL --device cpu --threads N --json` plus --kiln-args.

They alternate for --rounds rounds (default 3; the order flips every round: Kiln first,
then onnxruntime first, ...), each round the median of --iters runs after --warmup runs;
the figures reported are the medians over rounds, and the ratio is the median of the
rounds' ratios Kiln / onnxruntime (this VM's speed drifts by up to 2x for seconds at a
time; within a round both runtimes mostly see the same machine).

The work of one run comes from Kiln: the sum of the `flops` column of
`kiln inspect MODEL --json`, symbolic dims bound to the data set's input shapes; from it
both runtimes' GFLOP/s. The machine: CPU model name and ISA flags (lscpu), core count, and
its sgemm peak (numpy float32 2048^3 matmul, best of several, in a subprocess with
OPENBLAS/OMP/MKL_NUM_THREADS set) on 1 thread and on --threads threads.

--write-doc PATH replaces (or appends) this machine's section, keyed by CPU model, ISA
summary and threads, under `## CPU against onnxruntime` in PATH (docs/performance.md),
keeping every other machine's section and the rest of the file as they are.

Usage:
  scripts/bench_vs_onnxruntime.py [MODEL ...] [--kiln PATH] [--threads N] [--rounds N]
      [--iters N] [--warmup N] [--data-set N] [--kiln-args "..."] [--commit REV]
      [--write-doc PATH] [--json] [--gpu] [--gpu-iters N] [--compare-passes] [--no-sgemm]

The whole zoo into the docs (a quiet machine, nothing else building or benchmarking):
  python3 scripts/bench_vs_onnxruntime.py --kiln target/release/kiln --write-doc docs/performance.md
Prints a table, or with --json one JSON object (machine, rows, skipped models).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOC_HEADING = "## CPU against onnxruntime"
# ISA flags of interest, in the order they are reported (lscpu's names).
ISA_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"]
# The subset that names a machine's kind in its section key.
ISA_KEY_FLAGS = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile"]


def zoo_models(zoo):
    return sorted(m for m in os.listdir(zoo) if os.path.isfile(os.path.join(zoo, m, "model.onnx")))


def inputs_of(model_dir, data_set=0):
    ds = os.path.join(model_dir, f"test_data_set_{data_set}")
    files = sorted((f for f in os.listdir(ds) if f.startswith("input_")), key=lambda f: int(re.sub(r"\D", "", f) or 0))
    out = []
    for f in files:
        t = onnx.TensorProto()
        with open(os.path.join(ds, f), "rb") as fh:
            t.ParseFromString(fh.read())
        out.append((t.name, os.path.join(ds, f), numpy_helper.to_array(t)))
    return out


def symbolic_dims(model_path, inputs):
    """NAME -> size for the symbolic dims of the graph inputs, named as Kiln's importer names
    them: a dim_param keeps its name, an unnamed one ("", "?", -1, none) gets a fresh
    `unk__N` that avoids every dim_param of the file, in input order."""
    g = onnx.load(model_path, load_external_data=False).graph
    reserved = set()
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                reserved.add(d.dim_param)
    init = {t.name for t in g.initializer}
    shapes = {n: a.shape for n, _, a in inputs}
    dims, nxt = {}, 0
    for vi in g.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                continue
            if d.HasField("dim_param") and d.dim_param not in ("", "?", "-1"):
                name = d.dim_param
            else:
                while f"unk__{nxt}" in reserved:
                    nxt += 1
                name = f"unk__{nxt}"
                nxt += 1
            if vi.name in shapes and i < len(shapes[vi.name]):
                dims.setdefault(name, int(shapes[vi.name][i]))
    return dims


def kiln_flops(kiln, model, dims):
    """FLOPs of one run as Kiln counts them (sum of `kiln inspect --json`'s per-node flops)."""
    cmd = [kiln, "inspect", model, "--device", "cpu", "--json"]
    for k, v in dims.items():
        cmd += ["--dim", f"{k}={v}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    nodes = json.loads(out.stdout).get("nodes", [])
    return sum(n.get("flops") or 0 for n in nodes), None


def bench_ort(sess, feeds, iters, warmup):
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def ort_session(model, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


class KilnError(RuntimeError):
    pass


def bench_kiln(kiln, model, inputs, device, iters, warmup, extra=()):
    cmd = [kiln, "bench", model, "--device", device, "--iters", str(iters), "--warmup", str(warmup), "--json", *extra]
    for name, path, _ in inputs:
        cmd += ["-i", f"{name}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise KilnError(out.stderr.strip() or f"exit status {out.returncode}")
    return json.loads(out.stdout)


def short_error(err):
    """One line of Kiln's error: its first line, plus the op names of an unsupported-ops table."""
    lines = err.splitlines()
    first = next((l.strip() for l in lines if l.strip()), "")
    first = re.sub(r"^error:\s*", "", first)
    ops = [m.group(2) for l in lines if (m := re.match(r"^\s+(ai\.onnx(?:\.ml)?|com\.\S+)\s+(\S+)\s+\d+", l))]
    if ops:
        first = first.rstrip(":") + ": " + ", ".join(ops)
    return first


# ---------------------------------------------------------------- the machine

def lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout
    except OSError:
        return {}
    info = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    return info


def machine_info():
    info = lscpu()
    flags = set(info.get("Flags", "").split())
    if not flags and os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    present = [f for f in ISA_FLAGS if f in flags]
    key_isa = [f for f in ISA_KEY_FLAGS if f in flags]
    return {
        "cpu": info.get("Model name", "unknown CPU"),
        "vendor": info.get("Vendor ID"),
        "family": info.get("CPU family"),
        "model": info.get("Model"),
        "hypervisor": info.get("Hypervisor vendor"),
        "cpus": os.cpu_count(),
        "cores_per_socket": info.get("Core(s) per socket"),
        "sockets": info.get("Socket(s)"),
        "isa": present,
        "isa_summary": " ".join(key_isa) if key_isa else "no AVX2",
    }


SGEMM_CODE = r"""
import json, time, numpy as np
n = %d
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
c = a @ b
best = float("inf")
for _ in range(%d):
    t = time.perf_counter()
    np.matmul(a, b, out=c)
    best = min(best, time.perf_counter() - t)
blas = "?"
try:
    cfg = np.show_config(mode="dicts")
    d = cfg["Build Dependencies"]["blas"]
    blas = f'{d.get("name", "?")} {d.get("version", "")}'.strip()
except Exception:
    pass
print(json.dumps({"gflops": 2 * n**3 / best / 1e9, "blas": blas, "numpy": np.__version__}))
"""


def sgemm_peak(threads, n=2048, reps=5):
    """numpy float32 n^3 matmul, best of reps, in a subprocess pinned to `threads` BLAS threads."""
    env = dict(os.environ)
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[v] = str(threads)
    out = subprocess.run([sys.executable, "-c", SGEMM_CODE % (n, reps)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def kiln_commit(kiln):
    d = os.path.dirname(os.path.realpath(kiln))
    try:
        rev = subprocess.run(["git", "-C", d, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", d, "diff", "--quiet", "HEAD", "--"],
                               capture_output=True).returncode != 0
        return rev.stdout.strip() + (" (tree with uncommitted changes)" if dirty else "")
    except OSError:
        return None


# ---------------------------------------------------------------- the doc

def section_key(machine, threads):
    return f"### {machine['cpu']}, {machine['isa_summary']}, {threads} thread{'s' if threads != 1 else ''}"


def human(n):
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} "


def fmt_ms(x):
    return "" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.1f}")


def fmt_g(x):
    return "" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}")


def render_section(res):
    m, th = res["machine"], res["threads"]
    cpu = m["cpu"]
    extra = [f"{k} {m[k]}" for k in ("family", "model") if m.get(k)]
    if m.get("hypervisor"):
        extra.append(f"under {m['hypervisor']}")
    lines = [section_key(m, th), ""]
    lines.append(f"- date: {res['date']}")
    lines.append(f"- CPU: {cpu}" + (f" ({', '.join(extra)})" if extra else "") + f", {m['cpus']} logical CPUs")
    lines.append(f"- ISA: {' '.join(m['isa']) or 'none of ' + ' '.join(ISA_FLAGS)}")
    lines.append(f"- threads: {th} (onnxruntime intra_op_num_threads, `kiln bench --threads`)")
    s1, sn = res.get("sgemm_1"), res.get("sgemm_n")
    if s1 or sn:
        blas = (s1 or sn).get("blas", "?")
        lines.append(f"- sgemm peak (numpy {(s1 or sn).get('numpy')}, {blas}, float32 2048^3, best of 5): "
                     f"{fmt_g(s1 and s1['gflops'])} GFLOP/s on 1 thread, {fmt_g(sn and sn['gflops'])} GFLOP/s on {th} threads")
    lines.append(f"- onnxruntime {res['onnxruntime']}, Kiln {res['kiln_commit'] or 'unknown commit'}")
    lines.append(f"- each figure: median over {res['rounds']} alternating round{'s' if res['rounds'] != 1 else ''} of the median of {res['iters']} runs "
                 f"(after {res['warmup']} warm-up runs); data set {res['data_set']}")
    lines.append(f"- command: `{res['command']}`")
    lines.append("")
    lines.append("| model | onnxruntime ms | Kiln ms | ratio | Kiln GFLOP/s | onnxruntime GFLOP/s |")
    lines.append("|---|---|---|---|---|---|")
    for r in res["rows"]:
        name = r["model"] + (f" ({r['shapes']})" if r.get("dims") else "")
        lines.append(f"| {name} | {fmt_ms(r['ort_cpu_ms'])} | {fmt_ms(r['kiln_cpu_ms'])} | {r['ratio']:.2f}x | "
                     f"{fmt_g(r.get('kiln_gflops'))} | {fmt_g(r.get('ort_gflops'))} |")
    if res["skipped"]:
        lines.append("")
        lines.append("Not run: " + "; ".join(f"{s['model']} ({s['error']})" for s in res["skipped"]) + ".")
    return "\n".join(lines) + "\n"


def write_doc(path, res):
    """Replace this machine's section under DOC_HEADING in `path`, or append it there (creating
    the heading at the end of the file if missing); every other line stays as it is."""
    text = open(path).read() if os.path.exists(path) else "# Performance measurements\n"
    lines = text.splitlines()
    section = render_section(res).splitlines()
    key = section[0]
    start = next((i for i, l in enumerate(lines) if l.rstrip() == DOC_HEADING), None)
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", DOC_HEADING, "",
                  "`scripts/bench_vs_onnxruntime.py --write-doc docs/performance.md` writes one section per",
                  "machine here (keyed by CPU model, ISA and threads) and keeps the others, so results from",
                  "several machines accumulate. Ratio = Kiln / onnxruntime latency; GFLOP/s from the FLOPs",
                  "`kiln inspect` counts for one run."]
        start = len(lines) - 5
    # The heading's range ends at the next level-1 or level-2 heading.
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
    s = next((i for i in range(start + 1, end) if lines[i].rstrip() == key), None)
    if s is not None:
        e = next((i for i in range(s + 1, end) if re.match(r"^#{1,3} ", lines[i])), end)
        while e > s + 1 and not lines[e - 1].strip():
            e -= 1
        lines[s:e] = section
    else:
        ins = end
        while ins > start + 1 and not lines[ins - 1].strip():
            ins -= 1
        lines[ins:ins] = [""] + section + ([""] if ins == end and end < len(lines) and lines[end].strip() else [])
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="zoo model names (default: every model of the zoo)")
    ap.add_argument("--iters", type=int, default=30, help="timed runs per round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="alternating onnxruntime/Kiln rounds per model")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra_op_num_threads and kiln bench --threads")
    ap.add_argument("--gpu", action="store_true", help="also bench kiln on the GPU (lavapipe here)")
    ap.add_argument("--gpu-iters", type=int, default=3)
    ap.add_argument("--kiln", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "kiln"))
    ap.add_argument("--kiln-args", default="", help='extra arguments for every `kiln bench` call, e.g. "--no-tuning"')
    ap.add_argument("--commit", help="the Kiln commit to report (default: git rev-parse of the binary's repository)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--write-doc", metavar="PATH", help="write this machine's section into PATH (docs/performance.md)")
    ap.add_argument("--no-sgemm", action="store_true", help="skip measuring the sgemm peak")
    ap.add_argument("--data-set", type=int, default=0, help="which test_data_set_N of each model to feed")
    ap.add_argument("--kiln-baseline", action="append", default=[], metavar="MODEL=BASE",
                    help="also bench Kiln on zoo model BASE in MODEL's alternating rounds (e.g. "
                         "resnet18_int8_qdq=resnet18: Kiln int8 against Kiln f32 on the same machine)")
    ap.add_argument("--compare-passes", action="store_true",
                    help="also run kiln without its graph passes (before/after fusion)")
    # argparse takes a value starting with "--" only as --kiln-args=VALUE: accept both spellings.
    argv = sys.argv[1:]
    for i in range(len(argv) - 1):
        if argv[i] == "--kiln-args":
            argv[i:i + 2] = [f"--kiln-args={argv[i + 1]}"]
            break
    args = ap.parse_args(argv)
    zoo = os.path.normpath(os.environ.get("KILN_ZOO", os.path.join(ROOT, "..", "shared", "zoo")))
    models = args.models or zoo_models(zoo)
    kargs = shlex.split(args.kiln_args)
    cpu_args = ["--threads", str(args.threads), *kargs]
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    machine = machine_info()
    res = {
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "threads": args.threads,
        "onnxruntime": ort.__version__,
        "kiln": args.kiln,
        "kiln_commit": args.commit or kiln_commit(args.kiln),
        "kiln_args": kargs,
        "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup, "data_set": args.data_set,
        "command": "python3 scripts/bench_vs_onnxruntime.py " + shlex.join(sys.argv[1:]),
    }
    if not args.no_sgemm:
        res["sgemm_1"] = sgemm_peak(1)
        res["sgemm_n"] = sgemm_peak(args.threads) if args.threads != 1 else res["sgemm_1"]
    say(f"{machine['cpu']} [{' '.join(machine['isa'])}], {machine['cpus']} CPUs, {args.threads} thread{'s' if args.threads != 1 else ''}; "
        f"onnxruntime {ort.__version__}, Kiln {res['kiln_commit']}")
    if not args.no_sgemm:
        g = lambda s: f"{s['gflops']:.0f}" if s else "?"
        say(f"sgemm peak (numpy f32 2048^3): {g(res['sgemm_1'])} GFLOP/s on 1 thread, "
            f"{g(res['sgemm_n'])} on {args.threads}")

    rows, skipped = [], []
    for m in models:
        d = os.path.join(zoo, m)
        model = os.path.join(d, "model.onnx")
        try:
            inputs = inputs_of(d, args.data_set)
        except OSError as e:
            skipped.append({"model": m, "error": f"no data set {args.data_set}: {e}"})
            say(f"{m:14} skipped: no test_data_set_{args.data_set}")
            continue
        feeds = {n: a for n, _, a in inputs}
        dims = symbolic_dims(model, inputs)
        sess = None
        ort_r, kiln_r, kiln0_r, base_r, k = [], [], [], [], None
        base = dict(b.split("=", 1) for b in args.kiln_baseline).get(m)
        base_inputs = inputs_of(os.path.join(zoo, base), args.data_set) if base else None
        try:
            for r in range(args.rounds):
                # Kiln first in round 0 (so a model Kiln refuses costs nothing), then alternate.
                for who in (("kiln", "ort") if r % 2 == 0 else ("ort", "kiln")):
                    if who == "kiln":
                        k = bench_kiln(args.kiln, model, inputs, "cpu", args.iters, args.warmup, cpu_args)
                        kiln_r.append(k["median_ms"])
                        if args.compare_passes:
                            k0 = bench_kiln(args.kiln, model, inputs, "cpu", args.iters, args.warmup,
                                            ["--no-passes", *cpu_args])
                            kiln0_r.append(k0["median_ms"])
                        if base:
                            kb = bench_kiln(args.kiln, os.path.join(zoo, base, "model.onnx"), base_inputs, "cpu",
                                            args.iters, args.warmup, cpu_args)
                            base_r.append(kb["median_ms"])
                    else:
                        if sess is None:
                            sess = ort_session(model, args.threads)
                        ort_r.append(bench_ort(sess, feeds, args.iters, args.warmup))
        except KilnError as e:
            skipped.append({"model": m, "error": short_error(str(e).replace(model, "model.onnx"))})
            say(f"{m:14} skipped, Kiln refuses it:\n" + "\n".join("    " + l for l in str(e).splitlines()))
            continue
        except Exception as e:  # onnxruntime refusing a model
            skipped.append({"model": m, "error": f"onnxruntime: {str(e).splitlines()[0] if str(e) else type(e).__name__}"})
            say(f"{m:14} skipped, onnxruntime failed: {e}")
            continue
        del sess
        ort_ms, kiln_ms = statistics.median(ort_r), statistics.median(kiln_r)
        flops, ferr = kiln_flops(args.kiln, model, dims)
        shapes = []
        for _, _, a in inputs:
            if "x".join(map(str, a.shape)) not in shapes:
                shapes.append("x".join(map(str, a.shape)))
        row = {"model": m, "dims": dims, "shapes": ", ".join(shapes), "kiln_cpu_device": k.get("device"), "ort_cpu_ms": ort_ms, "kiln_cpu_ms": kiln_ms,
               "ratio": statistics.median(kr / orr for kr, orr in zip(kiln_r, ort_r)),
               "ort_rounds_ms": ort_r, "kiln_rounds_ms": kiln_r,
               "kiln_cpu_kernels": k["kernels_per_run"], "kiln_cpu_memory": k.get("memory"),
               "flops": flops,
               "kiln_gflops": flops / kiln_ms / 1e6 if flops else None,
               "ort_gflops": flops / ort_ms / 1e6 if flops else None}
        if ferr:
            row["flops_error"] = short_error(ferr)
        if base:
            row.update({"kiln_baseline": base, "kiln_baseline_ms": statistics.median(base_r), "kiln_baseline_rounds_ms": base_r})
        if args.compare_passes:
            row.update({"kiln_cpu_ms_no_passes": statistics.median(kiln0_r), "kiln_cpu_kernels_no_passes": k0["kernels_per_run"]})
        if args.gpu:
            g = bench_kiln(args.kiln, model, inputs, "gpu", args.gpu_iters, 1, kargs)
            row.update({"kiln_gpu_ms": g["median_ms"], "gpu_device": g["device"], "gpu_submits": g["submits_per_run"],
                        "gpu_kernels": g["kernels_per_run"]})
            if args.compare_passes:
                g0 = bench_kiln(args.kiln, model, inputs, "gpu", args.gpu_iters, 1, ["--no-passes", *kargs])
                row.update({"kiln_gpu_ms_no_passes": g0["median_ms"], "gpu_kernels_no_passes": g0["kernels_per_run"]})
        rows.append(row)
        line = (f"{m:14} onnxruntime {ort_ms:8.3f} ms   kiln cpu {kiln_ms:8.3f} ms   ratio {row['ratio']:5.2f}x")
        if flops:
            line += f"   {human(flops)}FLOP/run: kiln {row['kiln_gflops']:6.1f}, onnxruntime {row['ort_gflops']:6.1f} GFLOP/s"
        elif ferr:
            line += f"   (no FLOPs: {row['flops_error']})"
        if args.rounds > 1:
            line += f"   rounds ort {' '.join(f'{x:.3f}' for x in ort_r)} / kiln {' '.join(f'{x:.3f}' for x in kiln_r)}"
        if base:
            line += f"   kiln {base} {row['kiln_baseline_ms']:.3f} ms (rounds {' '.join(f'{x:.3f}' for x in base_r)})"
        if args.compare_passes:
            line += f" ({row['kiln_cpu_kernels']} kernels; without passes {row['kiln_cpu_ms_no_passes']:.2f} ms, {row['kiln_cpu_kernels_no_passes']} kernels)"
        if args.gpu:
            line += f"   kiln gpu {row['kiln_gpu_ms']:9.1f} ms ({row['gpu_submits']} submit/run, {row['gpu_kernels']} kernels)"
            if args.compare_passes:
                line += f" (without passes {row['kiln_gpu_ms_no_passes']:.1f} ms, {row['gpu_kernels_no_passes']} kernels)"
        say(line)
    res["rows"], res["skipped"] = rows, skipped
    if args.write_doc:
        write_doc(args.write_doc, res)
        say(f"wrote this machine's section into {args.write_doc}")
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
