"""The engine: the driver, the scheduler's job queues (one per device type), the studies that
move through their stages on their own, and the measuring workers that serve the queues."""
