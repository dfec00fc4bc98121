"""Running a plan on Paddle's parameter-server engine: a plan's stages run as Paddle heter-PS pipeline sections
(docs/sections.md), GPU-stage embeddings in the project's table.

These modules use Paddle (its private internals only through seam.py) and run inside launched processes; the plan
they run is made by the pure-Python heterps_paddle.planning.
"""
