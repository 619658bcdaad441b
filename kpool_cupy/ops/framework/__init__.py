"""What every op is built on: the description of an op (``spec``), the public functions bound from it
(``binding``), what it returns in each form (``results``), the checks every op shares (``checks``) and the
operands several ops share (``operands``). Nothing here knows a particular op."""
