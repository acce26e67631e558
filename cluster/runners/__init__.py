"""Running a built candidate (the Runner half): stage it and start it through a ``Runner``, the one
seam the search never sees behind: a fresh process per run (``_base.ProcessRunner``), or a host
process per device that loads each candidate in-process (``_base.HostRunner``): a program built as a
shared library (``persistent``), or one kernel's cubin with its harness (``kernel``,
``kernel_harness``)."""
