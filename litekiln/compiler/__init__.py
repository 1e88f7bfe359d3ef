"""litekiln compiler: partitioning, lowering to TVM Relax, OpenCL code generation."""
