#!/usr/bin/env bash
# The GPU checks of the analysis in one command, for a machine with a CUDA device and no network: the CUDA-gated
# tests and the torch solver's tests, then the NSV benchmark with the package's analysis on the GPU, then the
# whole network's pair program on the GPU (its test, then benchmarks/whole_network_scale.py there).
#
#   bash benchmarks/device_check.sh [DEVICE]        # DEVICE: cuda (default); cpu runs the same steps without a GPU
#
# It runs the package from this checkout (PYTHONPATH), with the python3 of the machine (torch, Lightning,
# scikit-learn, scipy, pytest and hypothesis installed; jsonargparse, which only the CLI needs, may be missing).
# Trained networks are read from and saved to NSV_CACHE (default .nsv_cache, ignored by git): copy the benchmark's
# --cache-dir there to skip training (about 1 min at m = 20,000 and 6 min at m = 60,000 on 2 cores); the
# m = 60,000 step runs only when its network is there. Results go to $OUT (default device_out/): env.txt,
# tests.txt, nsv_scale_DEVICE.md and the benchmark's log.
set -uo pipefail
cd "$(dirname "$0")/.."
device=${1:-cuda}
out=${OUT:-device_out}
cache=${NSV_CACHE:-.nsv_cache}
mkdir -p "$out" "$cache"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
  date -u
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, pytorch_lightning as pl, sklearn, scipy
print('torch', torch.__version__, 'lightning', pl.__version__, 'sklearn', sklearn.__version__, 'scipy', scipy.__version__)
print('cuda available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
} 2>&1 | tee "$out/env.txt"

# the CUDA-gated tests (skipped without CUDA) and the torch solver against numpy
python3 -m pytest -q -p no:cacheprovider -rs tests/solver/test_solver_device.py \
  "tests/callbacks/test_nsv_callback.py::test_the_torch_solver_gives_the_numpy_analysis" 2>&1 | tee "$out/tests.txt"
tests=${PIPESTATUS[0]}

large=0
[ -f "$cache/standin_m60000_seed0.pt" ] && large=60000
python3 benchmarks/nsv_scale.py --device "$device" --cache-dir "$cache" --large-m "$large" \
  --output "$out/nsv_scale_$device.md" 2>&1 | tee "$out/nsv_scale_$device.log"
bench=${PIPESTATUS[0]}

# the whole network: the compiled pair program's torch engine on the device against the CPU's numba runner, then
# the analysis at m = 2,000 and 10,000 (its pairs run as torch operations over batches on the device)
python3 -m pytest -q -p no:cacheprovider -rs "tests/kernel/test_pair_program.py::test_the_torch_engine_on_cuda_equals_numba" \
  2>&1 | tee -a "$out/tests.txt"
whole_tests=${PIPESTATUS[0]}
python3 benchmarks/whole_network_scale.py --device "$device" --block-mib 1024 --sizes 2000 10000 --dense-max 0 \
  --output "$out/whole_network_scale_$device" 2>&1 | tee "$out/whole_network_scale_$device.log"
whole=${PIPESTATUS[0]}

echo "tests exit $tests, benchmark exit $bench, whole-network tests exit $whole_tests, benchmark exit $whole" \
  | tee -a "$out/env.txt"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ] && [ "$whole_tests" -eq 0 ] && [ "$whole" -eq 0 ]
