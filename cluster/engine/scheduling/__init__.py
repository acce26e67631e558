"""Every unit of GPU work is a job (``jobs``): compiled ahead on any CPU, queued in lanes per device
type and dispatched to the measuring workers by the ``scheduler``; ``workers`` are the Ray side
(compile tasks, one measuring actor per GPU); ``simulate`` is a fake fleet for the driver's loop."""
