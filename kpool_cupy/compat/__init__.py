"""Other libraries' calls, answered by this package's ops: ``kpool_cupy.compat.deep_gemm``."""
