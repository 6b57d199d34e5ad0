"""The lab's layer: experiments run on the library, each a command of ``python -m alibi_ref``.

    bench          time and memory of every attention path against plain SDPA (``bench``)
    extrapolation  train short, test long: ALiBi against other position methods (``extrapolate``)
    figures        their plots, drawn without torch

It imports the library (``alibi_ref``) only; the course imports it. Its modules load torch, so
nothing is imported here: ``from alibi_ref.lab import bench``.
"""
