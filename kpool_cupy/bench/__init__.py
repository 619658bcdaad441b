"""`kpool-cupy bench`: device time of this package's kernel against the alternatives, in one run.

Speed is shown as ratios against baselines measured in the same run (a
device-to-device copy of the same bytes, the upstream-geometry kernel, the
array-library composites), never as absolute claims from elsewhere.
"""
