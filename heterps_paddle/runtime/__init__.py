"""Running a plan on Paddle's parameter-server engine: a plan's stages run as Paddle heter-PS pipeline sections
(docs/sections.md), GPU-stage embeddings in the project's table.

These modules use Paddle (its private internals only through the seam: seam.py reads and writes them, patches.py
replaces Paddle's functions, heter_builder.py subclasses its passes; heterps_paddle/graph_seam.py edits programs) and
run inside launched processes; the plan they run is made by the pure-Python heterps_paddle.planning.
"""
