"""The backends: where arrays live and how a launch runs. None of them knows an op.

``cupy`` (the GPU, through CuPy RawModule functions), ``emulate`` (the same
CUDA source built for the CPU, ``kpool_cupy.emulator``) and ``reference``
(each kernel written in NumPy, ``reference_kernels``). Each module also holds
its ``Binding``: how a public function of that backend places its arguments
before an op's call flow runs.
"""
