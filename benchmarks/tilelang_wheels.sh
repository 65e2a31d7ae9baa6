#!/usr/bin/env bash
# Download TileLang 0.1.15 and its non-torch dependencies as wheels for the GPU machine (CPython 3.12, manylinux
# x86_64; torch is already there) and print their sizes. The device carry limit is 64 MiB per call and all of it
# is ~79 MiB, so it is split in two folders (both ignored by git), each carried by its own call:
#   .whl/tilelang/  tilelang + apache-tvm-ffi, ml-dtypes, psutil, tqdm, cloudpickle, typing-extensions,
#                   torch-c-dlpack-ext (~52 MiB)
#   .whl/z3/        z3-solver 4.15.4 (~28 MiB; libtilelang.so links its libz3)
# On the GPU machine, into an ignored folder that stays while the machine is warm (one call per folder):
#   pip install --no-index --no-deps --target .whl/site .whl/z3/*.whl
#   pip install --no-index --no-deps --target .whl/site .whl/tilelang/*.whl
#   PYTHONPATH=.whl/site:. python benchmarks/tilelang_bench.py run benchmarks/tilelang_kernels --out $OUT
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PIP=${PIP:-pip}
TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform any)
mkdir -p .whl/tilelang .whl/z3
"$PIP" download -q "${TARGET[@]}" -d .whl/tilelang tilelang==0.1.15 "apache-tvm-ffi>=0.1.11,<0.1.13" cloudpickle \
    ml-dtypes psutil tqdm typing-extensions torch-c-dlpack-ext
"$PIP" download -q "${TARGET[@]}" -d .whl/z3 "z3-solver==4.15.4.0"
for d in .whl/tilelang .whl/z3; do
    du -cb "$d"/*.whl | awk -v d="$d" 'END { printf "%s: %.1f MiB\n", d, $1 / 1048576 }'
done
