#!/usr/bin/env python3
"""Data-parallel step time on paper: step(N) = compute / N + allreduce(N, bytes), the
all-reduce in the alpha-beta model, flat ring against hierarchical (reduce-scatter
within a machine, ring across machines, all-gather within), for ResNet-50 and
BERT-base at 1 to 1024 workers over 100 Gb/s and 25 Gb/s links.

    python3 scripts/scaling_model.py [--measured-alpha-us A --measured-gbps B]

First the model is fitted to this machine's loopback (alpha and bandwidth from the
kiln-allreduce-bench figures in docs/distributed.md) and checked against the measured
tiny_gpt step; then it is run with a cluster's numbers. Every assumption is printed.
"""
import argparse
import math

MB = 1 << 20


def ring(n, size, alpha, bw, buckets):
    """Flat ring over n workers: 2(n-1) steps per bucket, each moving size/n bytes."""
    if n == 1:
        return 0.0
    return buckets * 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw


def hierarchical(n, per_node, size, alpha, bw, alpha_in, bw_in, buckets):
    """Reduce-scatter within each machine, a ring across machines per slice (the
    machines' per_node rings share the NIC: size bytes through it in all), then an
    all-gather within the machine."""
    if n <= per_node:
        return ring(n, size, alpha_in, bw_in, buckets)
    m = n // per_node
    inside = 2 * (buckets * (per_node - 1) * alpha_in + (per_node - 1) / per_node * size / bw_in)
    across = buckets * 2 * (m - 1) * alpha + 2 * (m - 1) / m * size / bw
    return inside + across


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--measured-alpha-us", type=float, default=0.48,
                   help="per-message latency fitted to the 2-rank ring at 4 KB (docs/distributed.md)")
    p.add_argument("--measured-gbps", type=float, default=2.17,
                   help="the 2-rank ring's algorithm bandwidth at 256 MB, GB/s")
    a = p.parse_args()

    print("## The model on this machine (loopback, shared memory)")
    alpha, bw = a.measured_alpha_us * 1e-6, a.measured_gbps * 1e9
    print(f"alpha {a.measured_alpha_us} us per message, {a.measured_gbps} GB/s: fitted to the 2-rank ring "
          "(4 KB and 256 MB of the bandwidth table)")
    grad = 4 * 101_440  # tiny_gpt's parameters, f32
    compute = 13.04e-3  # its one-rank step, ms (scripts/bench_data_parallel.py)
    for n in (1, 2):
        t = compute / n + ring(n, grad, alpha, bw, 1)
        print(f"tiny_gpt, {n} rank(s): predicted {t * 1e3:.2f} ms per step")
    print("measured (scripts/bench_data_parallel.py, after backward): 13.04 and 7.31 ms;"
          " 4 ranks are oversubscribed on 2 cores and outside the model\n")

    print("## Predictions for clusters")
    print("Assumptions: 8 GPUs per machine joined by 150 GB/s (NVLink-class) at 2 us per message;"
          " machines joined by one NIC each at 100 or 25 Gb/s (12.5 / 3.125 GB/s) and 5 us per"
          " message; f32 gradients in buckets of 25 MB; no overlap of the reduction with backward"
          " (the pessimistic case; overlap can hide up to the backward pass's two thirds of the compute).")
    models = {
        # name: (gradient bytes, one GPU's compute time of the global batch, global batch)
        "ResNet-50 (25.6M parameters, global batch 8192)": (4 * 25.6e6, 8192 * 3.1e-3, 8192),
        "BERT-base (110M parameters, global batch 8192 x 128)": (4 * 110e6, 8192 * 11e-3, 8192),
    }
    print("One GPU's compute: ResNet-50 3.1 ms per image (forward and backward, a V100-class GPU in"
          " f32, ~320 images/s), BERT-base 11 ms per 128-token sequence (~6 x 110M x 128 FLOP at 8 TFLOP/s).")
    for name, (size, compute, batch) in models.items():
        buckets = math.ceil(size / (25 * MB))
        print(f"\n### {name}: {size / MB:.0f} MB of gradients, {buckets} buckets")
        print("| workers | per-worker batch | compute ms | flat ring 100 Gb/s | hierarchical 100 Gb/s | flat ring 25 Gb/s | hierarchical 25 Gb/s |")
        print("|---|---|---|---|---|---|---|")
        for n in (1, 8, 64, 256, 512, 1024):
            c = compute / n
            cells = []
            for gbps in (100, 25):
                bw_link = gbps / 8 * 1e9
                flat = ring(n, size, 5e-6 if n > 8 else 2e-6, bw_link if n > 8 else 150e9, buckets)
                hier = hierarchical(n, 8, size, 5e-6, bw_link, 2e-6, 150e9, buckets)
                cells += [f"{c / (c + flat):.0%} ({flat * 1e3:.0f} ms)", f"{c / (c + hier):.0%} ({hier * 1e3:.0f} ms)"]
            print(f"| {n} | {batch / n:g} | {c * 1e3:.1f} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    print("\nCells: scaling efficiency compute / (compute + all-reduce), and the all-reduce's time.")

    print("\n## Fixed per-worker batch (how Horovod and Goyal et al. measured), 25 Gb/s")
    print("Per-worker batch 32 (images / sequences); efficiency without overlap, and with the"
          " all-reduce overlapped with backward (two thirds of the compute): exposed ="
          " max(0, all-reduce - 2/3 compute).")
    print("| model | workers | compute ms | flat ring | flat, overlapped | hierarchical | hierarchical, overlapped |")
    print("|---|---|---|---|---|---|---|")
    for name, (size, compute, batch) in models.items():
        short = name.split(" (")[0]
        c = compute / batch * 32
        buckets = math.ceil(size / (25 * MB))
        for n in (64, 256, 512, 1024):
            flat = ring(n, size, 5e-6, 25 / 8 * 1e9, buckets)
            hier = hierarchical(n, 8, size, 5e-6, 25 / 8 * 1e9, 2e-6, 150e9, buckets)
            eff = lambda t: c / (c + t)
            ovl = lambda t: c / (c + max(0.0, t - 2 / 3 * c))
            print(f"| {short} | {n} | {c * 1e3:.0f} | {eff(flat):.0%} | {ovl(flat):.0%} | {eff(hier):.0%} | {ovl(hier):.0%} |")


if __name__ == "__main__":
    main()
