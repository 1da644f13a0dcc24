#!/usr/bin/env bash
# ./remat install --prefix DIR: installs remat for use without Bazel.
#
#   DIR/include/remat/remat.h       the umbrella header, and the headers it reaches
#   DIR/lib/libremat.so, libremat.a the libraries (CPU kernels, plus CUDA when built with it)
#   DIR/lib/pkgconfig/remat.pc      pkg-config: cflags and libs
#   DIR/lib/cmake/remat/            find_package(remat) -> target remat::remat
#   DIR/lib/pythonX.Y/dist-packages/remat.so   the Python module (import remat; on
#                                   Debian's path for DIR=/usr/local, else PYTHONPATH)
#
# Run through ./remat, which builds everything first.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:-}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    *) echo "remat install: unknown argument '$1'; usage: ./remat install --prefix DIR" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "remat install: --prefix DIR is required" >&2; exit 2; }
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

# Headers: everything api/remat.h reaches, at the same relative paths.
inc="$prefix/include/remat"
rm -rf "$inc"
mkdir -p "$inc"
/usr/bin/python3 - "$inc" <<'PY'
import os, re, shutil, sys
dest = sys.argv[1]
seen, stack = set(), ["api/remat.h"]
while stack:
    f = stack.pop()
    if f in seen:
        continue
    seen.add(f)
    for line in open(f):
        m = re.match(r'#include "([^"]+)"', line)
        if m:
            if not os.path.exists(m.group(1)):
                sys.exit(f"remat install: {f} includes {m.group(1)}, which is not in the tree")
            stack.append(m.group(1))
for f in sorted(seen):
    target = os.path.join(dest, "remat.h" if f == "api/remat.h" else f)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(f, target)
print(f"  {len(seen)} headers")
PY

# Libraries from the Bazel archives (position-independent objects). The CUDA
# back end is there only in a build with the toolkit, which the built binary
# reports: its kernels and device back end (libkernels.lo) and the ops' CUDA
# kernel tables (libcuda.lo), both linked whole (they register themselves).
with_cuda=0
bazel-bin/tools/remat info | grep -q "CUDA back end : built" && with_cuda=1
libs=(engine ops checkpoint moe models parallel train)
archives=()
for l in "${libs[@]}"; do archives+=("bazel-bin/$l/lib$l.a"); done
[ "$with_cuda" -eq 1 ] && archives+=("bazel-bin/cuda/libkernels.lo" "bazel-bin/cuda/libcuda.lo")
mkdir -p "$prefix/lib"
rm -f "$prefix/lib/libremat.a"
{
  echo "CREATE $prefix/lib/libremat.a"
  for a in "${archives[@]}"; do echo "ADDLIB $a"; done
  echo "SAVE"
  echo "END"
} | ar -M

# What the libraries need at link time: OpenMP, OpenBLAS, BLIS (its static
# archive, after OpenBLAS so that cblas_sgemm resolves to OpenBLAS's), OpenMPI (process
# groups), xxHash (state checksums), and the CUDA runtime and cuBLASLt when
# the build has them.
blis=/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.a
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
mpi=/usr/lib/x86_64-linux-gnu/openmpi/lib
deps="-fopenmp -L$blas -Wl,-rpath,$blas -lopenblas $blis -L$mpi -Wl,-rpath,$mpi -lmpi -lxxhash"
if [ "$with_cuda" -eq 1 ]; then
  cuda=$(readlink -f /usr/local/cuda)/lib64
  deps="$deps -L$cuda -Wl,-rpath,$cuda -lcudart -lcublasLt"
fi
# shellcheck disable=SC2086
g++ -shared -o "$prefix/lib/libremat.so" -Wl,-soname,libremat.so \
  -Wl,--whole-archive "${archives[@]}" -Wl,--no-whole-archive $deps

mkdir -p "$prefix/lib/pkgconfig" "$prefix/lib/cmake/remat"
cat > "$prefix/lib/pkgconfig/remat.pc" <<PC
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: remat
Description: C++ tensor and autograd engine with first-class saved tensors and recompute plans
Version: 0.1.0
Cflags: -std=c++20 -I\${includedir} -I\${includedir}/remat
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lremat
Libs.private: $deps
PC
cat > "$prefix/lib/cmake/remat/rematConfig.cmake" <<CM
# remat: find_package(remat) gives the imported target remat::remat.
get_filename_component(_remat_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET remat::remat)
  add_library(remat::remat SHARED IMPORTED)
  set_target_properties(remat::remat PROPERTIES
    IMPORTED_LOCATION "\${_remat_prefix}/lib/libremat.so"
    INTERFACE_INCLUDE_DIRECTORIES "\${_remat_prefix}/include;\${_remat_prefix}/include/remat"
    INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()
set(remat_FOUND TRUE)
CM
cat > "$prefix/lib/cmake/remat/rematConfigVersion.cmake" <<CM
set(PACKAGE_VERSION "0.1.0")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
CM
# The Python module: one self-contained extension (the libraries linked in),
# in the folder Debian's python3 searches under /usr/local (X.Y: its version).
pydir="$prefix/$(/usr/bin/python3 -c 'import sys; print("lib/python%d.%d/dist-packages" % sys.version_info[:2])')"
mkdir -p "$pydir"
install -m 0755 bazel-bin/python/remat.so "$pydir/remat.so"
echo "  python module: $pydir/remat.so"

echo "installed remat in $prefix ($(du -sh "$prefix/include/remat" | cut -f1) headers, libremat.so $(du -h "$prefix/lib/libremat.so" | cut -f1), libremat.a $(du -h "$prefix/lib/libremat.a" | cut -f1))"
