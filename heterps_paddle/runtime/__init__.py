"""Heterogeneous sections: a plan's stages run as Paddle heter-PS pipeline sections (docs/sections.md).

plan.py is pure Python; the other modules import Paddle and are used inside launched processes.
"""
