"""litekiln runtime: runs compiled programs with pyopencl + numpy. Never imports TVM."""
