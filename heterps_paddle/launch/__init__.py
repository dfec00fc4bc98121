"""A job's life, on one host and across hosts: the rules of its rounds as one pure state machine (machine.py) and
the shells that carry its actions out: the driver of a host's launch (driver.py), the coordinator across hosts
(coordinator.py), its members (member.py) and the supervisor of Paddle's launcher (supervisor.py, child.py)."""
