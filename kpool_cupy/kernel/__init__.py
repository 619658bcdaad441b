"""What Python knows about the CUDA sources in ``kernels/``.

Where they live and the one text the compilers see (``sources``), every
``__global__`` declared once with its template parameters and parameters
(``declarations``), the argument codes and per-operand argument pieces
(``codes``), the launch geometry (``geometry``), the kernels' request
lookups for many tokens at once on the host (``requests``), and compiling
a kernel with NVRTC without a GPU (``nvrtc``: ``kpool_cupy.compile_ptx`` and
the PTX and ptxas reports the developer tools read). Nothing here allocates
or launches.
"""
