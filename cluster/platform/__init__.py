"""The machine a worker runs on: its devices (``devices``)."""
