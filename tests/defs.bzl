"""remat_test: a Catch2 test binary linked with the shared test main."""

def remat_test(name, srcs, deps = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["//tests:main", "@catch2"],
        **kwargs
    )
