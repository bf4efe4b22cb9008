"""Our CPU decode path: the C kernels (cpu_decode.c) and the loader that builds and trusts them (trusted, matmul),
the thread plan (threads), the packed weights and the row and fused steps that use them, and the lower-precision
variants (precision)."""
