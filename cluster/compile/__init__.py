"""Building a candidate (the Builder half): its sources and flags to a binary in the sandbox
(``build``), a kernel target's kernel to a cubin (``kernel``), ``validate --build``'s check that each
param reaches the program (``probe``), and the timing harness's headers the builds include
(``include/warpfleet/``, package data)."""
