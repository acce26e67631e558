"""The sandbox: every build and run of a candidate as an untrusted command (``sandbox``: the
contract and ``run_command``), in bubblewrap (``bwrap``) with per-command limits (``cgroups``), the
node's choice of sandbox (``isolation``), the worker's only way into a candidate's directory
(``untrusted_dir``), a long-lived host process that runs candidates in-process (``host``), and
``warpfleet doctor`` (``doctor``)."""
