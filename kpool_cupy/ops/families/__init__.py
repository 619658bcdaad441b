"""What a few ops share, one module a family: pooling a ragged batch's tokens (``pooling``), the per-request
rings (``rings``), where pooled rows go and the FP8 forms (``destinations``, ``fp8_target``, ``fp8_form``),
the expansion of selected pools to positions (``expansion``), scoring against the FP8 cache (``scoring``) and
selecting the best pools (``selection``). A family imports the framework and other families, never an op."""
