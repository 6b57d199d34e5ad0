#!/usr/bin/env bash
# The GPU check of alibi_ref (docs/performance.md, "To check a GPU"), prepared for a lent GPU machine's short time:
#
#   bash benchmarks/gpu_check.sh               # one call, timeout_s=590: a session's 15 device minutes hold one
#   bash benchmarks/gpu_check.sh 16384 4096    # the bench table of `auto` (a second call, where time is left)
#
# Times on an H200 and an H100 (benchmarks/results/, docs/performance.md "CUDA"): the environment ~6 s, the tests
# 60-140 s, a bench row ~11 s (a fresh process each, FlexAttention compiled in each: 20 rows of five paths take
# about 215 s at N = 4096 and more than 300 s at 16384), a tuning variant ~70 s at N = 16384 and ~30 s at 4096.
# The tuning stages time the library beside plain SDPA's floor and the candidates still open
# (benchmarks/flex_tuning.py: tune-16384, the kernel's part; tune-4096, the host's part), and the
# bench runs when named by its size N, with PATHS="..." for other paths than the three that decide `auto`.
#
# Stages run in the order given, each under its own time limit so that one that hangs leaves the
# others their time; `bench` and flex_tuning print and save each row as it finishes, so a stage cut
# short keeps what it measured. What each stage writes goes to $OUT (the device tool's folder;
# ./gpu_check elsewhere): env.txt, tests.txt, jax.txt, tune-N.txt and tune-N/flex_tuning.jsonl (decode-N alike),
# bench-N/ (bench.json, bench.png) and bench-N.txt (window-N alike).
# The machine's python3 holds torch with CUDA, JAX, Flax, pytest and hypothesis; the course's tools
# (nbgrader, JupyterLab) are not needed here. Stages: env, tests, jax, tune-N, decode-N, window-N (a sliding
# window on each path that takes one: which `auto` should pick for windows on CUDA, today sdpa), padded-N (a
# left-padded batch: the same question for padding), or a size N for bench.
#
# Wheels the machine lacks travel in .whl/ (ignored by git; the device tool's `carry`), installed here first:
# the cudnn_alibi tuning variant needs cuDNN's frontend, fetched on a machine with pip's network by
#   echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl nvidia-cudnn-frontend==1.16.0
# (1.16.0: 2 MB, no required dependencies; later versions require cutlass-dsl.) Without it that variant's row
# says so and the others run.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
        .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/gpu_check_site
fi
# torch, JAX and numpy newer than this machine's may warn of what they will change; not this check's subject
pytest_=("$py" -m pytest -p no:cacheprovider -q -W "default::FutureWarning" -W "default::DeprecationWarning")
[ $# -gt 0 ] || set -- env tests tune-16384 tune-4096 jax
paths=${PATHS:-plain_sdpa alibi_default flex_no_bias}
# benchmarks/flex_tuning.py's variants, most telling first (a stage cut short keeps its rows; each row times plain
# SDPA beside it): cuDNN's own ALiBi (causal; 2.75x plain at 4096 on the H100 of 2026-11-27, not yet timed at 16384)
# and FlexAttention skipping the tiles beyond each head's reach (never run yet), the kernels that could reach 1.2x;
# then the library, at 16384 beside its floor with no bias, at 4096 beside its kernel called directly. Left out since
# that run: cudnn_bias (a bias built at every call: 12x forward at 4096) and key_term_only (the H100 of 2026-11-26).
# KERNEL_VARIANTS="..." for others (tiles, prescale, rows_safe, tma, autotune, positions: docs/performance.md)
kernel_variants=${KERNEL_VARIANTS:-cudnn_alibi flex_reach library flex_no_bias cudnn_strided}
host_variants=${HOST_VARIANTS:-cudnn_alibi flex_reach library direct}
decode_variants=${DECODE_VARIANTS:-library direct sdpa_bias}
# causal first: cuDNN's own ALiBi takes only causal calls, and causal is the models' case (BLOOM, MPT)
masks=${MASKS:-causal symmetric}

stage() {  # name, seconds, command...: run it, show its tail, keep all of it in $out/name.txt
    local name=$1 limit=$2
    shift 2
    echo "=== $name (at most ${limit} s) ==="
    local started=$SECONDS
    # SIGINT first: pytest then still prints the failures it met, which a stage cut at its limit would lose
    timeout --signal=INT --kill-after=10 "$limit" "$@" >"$out/$name.txt" 2>&1
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
        stage tests 240 "${pytest_[@]}" -m cuda tests/test_attention.py tests/test_bias.py tests/test_padding.py \
            tests/test_cli_and_explain.py tests/test_fused_paths.py tests/test_nn.py tests/test_plans.py ;;
    jax)  # JAX puts arrays on its default device: the GPU where jax-cuda is installed. Not the two property
          # tests: 40 shapes each, one XLA compilation a shape (on the H200 the first took most of 90 s); the
          # CPU suite runs them
        stage jax 60 bash -c "$py -c 'import jax; print(\"JAX on\", jax.devices())' && ${pytest_[*]} tests/test_jax.py \
            -k 'not (numpy_torch_and_jax_agree_in_float64 or jax_fused_path_in_float32)'" ;;
    tune-[0-9]*)  # where flex's time goes and what might cut it: rows of variant, mask, pass; synced and queued
        n=${what#tune-}
        variants=$([ "$n" -ge 8192 ] && echo "$kernel_variants" || echo "$host_variants")
        # shellcheck disable=SC2086  # $variants and $masks: one word each
        stage "$what" "$([ "$n" -ge 8192 ] && echo 200 || echo 90)" "$py" benchmarks/flex_tuning.py --sizes "$n" \
            --variants $variants --masks $masks --no-plot --output "$out/$what" ;;
    decode-[0-9]*)  # a decoding step, one query against N keys (B = 8): flex or the bias SDPA reads, for auto
        # shellcheck disable=SC2086  # $decode_variants: one word per variant
        stage "$what" 90 "$py" benchmarks/flex_tuning.py --decode --sizes "${what#decode-}" --variants $decode_variants \
            --no-plot --output "$out/$what" ;;
    padded-[0-9]*)  # a left-padded batch of 8 (BLOOM's positions), bf16: flex with its block mask built per call from
        # the tiles' bounds (flex._rows_block_mask, untimed on a GPU) against the bias sdpa reads, which auto takes
        stage "$what" 150 "$py" -m alibi_ref bench --device cuda --sizes "${what#padded-}" --dtype bfloat16 --backward \
            --batch 8 --left-padded --paths plain_sdpa sdpa_float_bias flex_compiled --output "$out/$what" ;;
    window-[0-9]*)  # a window of 256 keys each side (causal rows: 256 back) on every path that takes one, bf16
        stage "$what" 150 "$py" -m alibi_ref bench --device cuda --sizes "${what#window-}" --dtype bfloat16 --backward \
            --window 256 256 --paths plain_sdpa sdpa_float_bias strided_mask flex_compiled --output "$out/$what" ;;
    [0-9]*)  # the table that decides auto on CUDA: bf16, forward and forward+backward, both masks
        # shellcheck disable=SC2086  # $paths: one word per path
        stage "bench-$what" 200 "$py" -m alibi_ref bench --device cuda --sizes "$what" --dtype bfloat16 --backward \
            --paths $paths --output "$out/bench-$what" ;;
    *)
        echo "unknown stage '$what': expected env, tests, jax, tune-N, decode-N, window-N, padded-N or a sequence length N" >&2
        exit 2 ;;
    esac
done
