"""A job's life, on one host and across hosts: the rules of its rounds as one pure state machine (machine.py)."""
