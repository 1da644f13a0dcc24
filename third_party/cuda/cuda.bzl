"""cuda_library: compiles .cu files with nvcc (sm_90) into a cc_library.

Headers of `deps` (their CcInfo) are visible to nvcc, so a kernel file can
include engine headers. Objects are position independent, so the library links
into tests, tools and the shared library alike. Without a toolkit the macro
makes a cc_library with the same name and headers only. Either way the
library defines REMAT_HAVE_CUDA (1 or 0) for its dependents (cuda/config.h).
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC")

_NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    # SASS for sm_90 (H100/H200) only: no PTX, which would double every
    # binary (the GPU check bundle must stay small).
    "-gencode=arch=compute_90,code=sm_90",
    "-Xcompiler=-fPIC,-Wall,-Wextra",
]

def _nvcc_objects_impl(ctx):
    headers = []
    includes = []
    for dep in ctx.attr.deps:
        cc = dep[CcInfo].compilation_context
        headers.append(cc.headers)
        includes += cc.includes.to_list() + cc.quote_includes.to_list() + cc.system_includes.to_list()
    header_set = depset(ctx.files.hdrs, transitive = headers)
    include_flags = ["-I."] + ["-I" + i for i in includes]
    include_flags += ["-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    objs = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_nvcc/%s/%s.o" % (ctx.label.name, src.basename[:-3]))
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = _NVCC_FLAGS + ctx.attr.copts + include_flags + ["-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [header_set]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "nvcc": attr.string(),
    },
)

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], cc_srcs = [], **kwargs):
    """A cc_library whose .cu `srcs` are compiled by nvcc for sm_90.

    cc_srcs are host C++ sources (calling the CUDA runtime) compiled into the
    same library. Without a toolkit the library has the headers only: its
    dependents compile their CUDA branches out (`if constexpr (kHaveCuda)`).
    """
    if not HAS_CUDA:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, defines = ["REMAT_HAVE_CUDA=0"], **kwargs)
        return
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:headers"],
        copts = copts + ["-DREMAT_HAVE_CUDA=1"],
        nvcc = NVCC,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"] + cc_srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        defines = ["REMAT_HAVE_CUDA=1"],
        linkstatic = True,
        **kwargs
    )
