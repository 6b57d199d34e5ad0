#!/usr/bin/env bash
# The GPU check of alibi_ref (README, "To check a GPU"), prepared for a lent GPU machine's short time:
#
#   bash benchmarks/gpu_check.sh tests 4096    # first call, at most 9 minutes (run with timeout_s=600): the CUDA tests, then the N = 4096 table
#   bash benchmarks/gpu_check.sh 16384         # second call, on the still-warm machine
#
# Stages run in the order given, each under its own time limit so that one that hangs leaves the
# others their time; `bench` prints and saves each row as it finishes, so a stage cut short keeps
# what it measured. What each stage writes goes to $OUT (the device tool's folder; ./gpu_check
# elsewhere): env.txt, tests.txt, jax.txt, bench-N/ (bench.json, bench.png) and bench-N.txt, reset.txt.
# The machine's python3 holds torch with CUDA, JAX, Flax, pytest and hypothesis; the course's tools
# (nbgrader, JupyterLab) are not needed here. Stages: env, tests, jax, reset, or a size N for bench.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# torch, JAX and numpy newer than this machine's may warn of what they will change; not this check's subject
pytest_=("$py" -m pytest -p no:cacheprovider -q -W "default::FutureWarning" -W "default::DeprecationWarning")
[ $# -gt 0 ] || set -- env tests jax 4096 16384 reset

stage() {  # name, seconds, command...: run it, show its tail, keep all of it in $out/name.txt
    local name=$1 limit=$2
    shift 2
    echo "=== $name (at most ${limit} s) ==="
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.txt"
    echo "=== $name: exit $rc after $((SECONDS - started)) s$([ $rc = 124 ] && echo ', cut at its time limit') ==="
}

for what in "$@"; do
    case $what in
    env)
        stage env 30 bash -c "nvidia-smi; $py -c 'import sys, torch; print(sys.version); \
print(\"torch\", torch.__version__, \"CUDA\", torch.version.cuda, \"cuDNN\", torch.backends.cudnn.version()); \
print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())'; \
$py -m pip list 2>/dev/null | grep -iE '^(torch|triton|jax|jaxlib|flax|numpy|hypothesis|pytest) '" ;;
    tests)  # every torch test on cuda (the CPU runs are make test's): paths, bias, padding, the layer, the CLI
        stage tests 200 "${pytest_[@]}" -m cuda tests/test_attention.py tests/test_bias.py tests/test_padding.py \
            tests/test_cli_and_explain.py tests/test_fused_paths.py tests/test_nn.py ;;
    jax)  # JAX puts arrays on its default device: the GPU where jax-cuda is installed
        stage jax 150 bash -c "$py -c 'import jax; print(\"JAX on\", jax.devices())' && ${pytest_[*]} tests/test_jax.py" ;;
    reset)  # what the checks' per-check dynamo.reset() costs a student's next compiled call on CUDA
        stage reset 120 "$py" benchmarks/dynamo_reset_cost.py ;;
    [0-9]*)  # the table that decides auto on CUDA: bf16, forward and forward+backward, both masks
        stage "bench-$what" 300 "$py" -m alibi_ref bench --device cuda --sizes "$what" --dtype bfloat16 --backward \
            --paths plain_sdpa alibi_default strided_mask flex_compiled sdpa_float_bias --output "$out/bench-$what" ;;
    *)
        echo "unknown stage '$what': expected env, tests, jax, reset or a sequence length" >&2
        exit 2 ;;
    esac
done
