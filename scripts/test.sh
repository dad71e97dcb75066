#!/usr/bin/env bash
# Installs what Kiln's tests need, then runs every test.
#   - a C compiler (cc), for the custom-op C kernel and the C API tests;
#   - a fresh virtual environment (.cache/venv) with Kiln's Python package built by
#     maturin (pip fetches it), pytest, onnx and onnxruntime;
#   - Mesa's lavapipe (software Vulkan), so the GPU path runs for real without a GPU;
#   - Open MPI and libclang (Debian), for kiln-distributed's mpi feature and its
#     multi-rank tests (mpirun --oversubscribe on loopback; as root, with Open MPI's
#     OMPI_ALLOW_RUN_AS_ROOT variables, which the tests set);
#   - the onnx Python package, whose backend node tests are materialised once into
#     $KILN_ONNX_TESTS (default .cache/onnx-node-tests);
#   - the model zoo is expected at $KILN_ZOO (default ../shared/zoo);
#   - onnxruntime, whose transformer optimizer writes bert_tiny and gpt2_tiny with its
#     com.microsoft fused ops, and whose quantization tool writes lstm_tagger with
#     DynamicQuantizeLSTM, into $KILN_OPTIMIZED_ZOO (default .cache/optimized-zoo).
# GPU tests fail (never skip) when no adapter is found.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || ! ldconfig -p | grep -q libvulkan.so.1; then
  echo "== installing Mesa lavapipe (software Vulkan)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi

if ! command -v cc >/dev/null 2>&1; then
  echo "== installing a C compiler (custom-op C kernels and the C API are tested with it)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi

if ! command -v mpirun >/dev/null 2>&1 || ! dpkg -s libopenmpi-dev libclang-dev >/dev/null 2>&1; then
  echo "== installing Open MPI and libclang (kiln-distributed's mpi feature and its multi-rank tests)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev libclang-dev clang pkg-config >/dev/null
fi

if ! python3 -c "import onnx, numpy" 2>/dev/null; then
  echo "== installing the onnx Python package (conformance test data)"
  python3 -m pip install -q --disable-pip-version-check "onnx==1.23.*" numpy
fi

if ! python3 -c "import onnxruntime" 2>/dev/null; then
  echo "== installing onnxruntime (its transformer optimizer writes the com.microsoft zoo variants)"
  python3 -m pip install -q --disable-pip-version-check "onnxruntime==1.32.*"
fi

export KILN_ONNX_TESTS="${KILN_ONNX_TESTS:-$PWD/.cache/onnx-node-tests}"
python3 scripts/materialize_onnx_tests.py "$KILN_ONNX_TESTS"

export KILN_ZOO="${KILN_ZOO:-$(cd .. && pwd)/shared/zoo}"
if [ ! -d "$KILN_ZOO" ]; then
  echo "!! the model zoo is missing at $KILN_ZOO: the end-to-end tests will fail."
  echo "!! Put the shared zoo beside this repository (../shared/zoo) or set KILN_ZOO."
fi

export KILN_OPTIMIZED_ZOO="${KILN_OPTIMIZED_ZOO:-$PWD/.cache/optimized-zoo}"
if [ -d "$KILN_ZOO" ]; then
  python3 scripts/optimize_transformers.py "$KILN_OPTIMIZED_ZOO"
  python3 scripts/quantize_lstm.py "$KILN_OPTIMIZED_ZOO"
  export KILN_EXACT_INT_ZOO="${KILN_EXACT_INT_ZOO:-$PWD/.cache/exact-int-zoo}"
  python3 scripts/qdq_int_reference.py --zoo "$KILN_ZOO" --write "$KILN_EXACT_INT_ZOO"
fi

if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
  export XDG_RUNTIME_DIR="$(mktemp -d)"
fi

echo "== unit and integration tests"
# These include the fuzz smoke (crate kiln-fuzz, fuzz-targets/): every fuzz target over its
# seeds, regressions and deterministic mutations, on stable, in memory-limited child
# processes; it needs nothing installed beyond the zoo. Real fuzzing (nightly, cargo-fuzz)
# is fuzz/run.sh; see docs/reliability.md.
cargo test --release --workspace --exclude kiln
echo "== data parallelism over MPI (the mpi feature): multi-rank runs under mpirun on loopback"
cargo test --release -p kiln-distributed --features mpi
cargo test --release -p kiln --features mpi --test distributed_mpi -- --nocapture --test-threads 1
echo "== end-to-end tests: the zoo and the ONNX conformance suite, on the CPU and the GPU"
cargo test --release -p kiln -- --nocapture --test-threads 2
echo "== the Python package: the wheel built and installed into a fresh venv, pytest against onnxruntime on the CPU and the GPU"
rm -rf .cache/venv
python3 -m venv .cache/venv
CARGO_TARGET_DIR="$PWD/target" .cache/venv/bin/pip install -q --disable-pip-version-check ./python
.cache/venv/bin/pip install -q --disable-pip-version-check pytest "onnx==1.23.*" "onnxruntime==1.32.*"
.cache/venv/bin/python -c "import kiln; print(kiln.devices())"
.cache/venv/bin/python -m pytest -q python/tests
echo "== the Rust custom-op example (an application outside the workspace), on every device"
# The workspace's target folder: the example reuses the dependencies built above.
CARGO_TARGET_DIR="$PWD/target" cargo run --release --manifest-path samples/custom-op-rust/Cargo.toml
