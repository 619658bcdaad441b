"""The CPU emulator: the CUDA sources built by the host C++ compiler and launched through ctypes.

``toolchain`` finds the compiler and builds and caches one shared library
per kernel instantiation; ``launch`` runs a grid with CUDA-style arguments,
checking their widths, and records what each launch did (its 16-byte
accesses) for tests. kernels/emulator/ supplies the CUDA built-ins and the
threads that cooperate; the toolchain puts it before every host build.
"""
