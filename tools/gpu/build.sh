#!/usr/bin/env bash
# Builds the GPU check bundle: every test binary that has CUDA cases and the
# remat binary (for bench), built with -c opt and stripped, with the shared
# libraries they load that a bare GPU machine may lack (the project's own
# Bazel .so files, OpenBLAS, OpenMPI, libgomp, libstdc++ ...) packed into one
# .tar.xz,
# plus the runner. The bundle stays under 64 MiB so it can be carried to a
# GPU machine as is:
#
#   tools/gpu/build.sh                  # here: writes out/gpu-check/
#   out/gpu-check/run.sh OUTDIR         # there: runs the CUDA tests and benches into OUTDIR
#
# With the device tool: run(command="out/gpu-check/run.sh $OUT", carry=["out/gpu-check"]).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
out=out/gpu-check
log=$(mktemp)
bazel build -c opt //tests/... //tools:remat > "$log" 2>&1 || { cat "$log"; rm -f "$log"; exit 1; }
rm -f "$log"
bazel-bin/tools/remat info | grep -q "CUDA back end : built" ||
  echo "gpu/build.sh: warning: this build has no CUDA toolkit; the bundle's CUDA tests will all skip" >&2
rm -rf "$out"
mkdir -p "$out/stage/bin" "$out/stage/lib"
# Test binaries with [cuda] cases (found by their tags in the sources).
bins=(bazel-bin/tools/remat)
for src in $(grep -l '"\[cuda\]' tests/*/*_test.cc); do
  bins+=("bazel-bin/$(dirname "$src")/$(basename "$src" .cc)")
done
cp "${bins[@]}" "$out/stage/bin/"
chmod u+w "$out"/stage/bin/*
strip --strip-unneeded "$out"/stage/bin/*
# Shared libraries outside glibc and the CUDA toolkit (the GPU machine has
# those; run.sh finds the CUDA ones).
for bin in "${bins[@]}"; do  # from where they were built, so their rpaths resolve
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
    libcuda.so*|libcublas*|libcudnn*|libnccl*|libnvrtc*) ;;  # the driver and toolkit (not the project's libcuda_S*.so)
    *) cp -L "$lib" "$out/stage/lib/" ;;
  esac
done
# Binaries and libraries in one archive. The test binaries are mostly the
# same bytes (each links the engine and every kernel): a dictionary larger
# than all of them together (one thread, one block) stores those bytes once,
# 23 MiB where xz -6 made 57 (decompressing takes 384 MiB of memory).
tar -C "$out/stage" -cf - bin lib | xz -T1 --lzma2=preset=6,dict=384MiB > "$out/bundle.tar.xz"
rm -rf "$out/stage"
cp tools/gpu/run.sh "$out/run.sh"
cp tools/gpu/summarize.py tools/reference/bench_torch.py tools/reference/compare_dumps.py "$out/"
chmod +x "$out/run.sh"
size=$(du -sm "$out" | cut -f1)
echo "gpu check bundle in $out: $(tar -tJf "$out/bundle.tar.xz" | grep '^bin/.' | sed 's|bin/||' | tr '\n' ' ')(${size} MiB)"
[ "$size" -lt 64 ] || { echo "gpu/build.sh: the bundle is ${size} MiB, over the 64 MiB a device run can carry" >&2; exit 1; }
