"""What Python knows about the CUDA sources in ``kernels/``.

Where they live and the one text the compilers see (``sources``), the
instantiation names (``names``), the argument codes and per-operand argument
pieces (``codes``), and the launch geometry (``geometry``). Nothing here
allocates or launches.
"""
