"""Step trace: one JSON record per scheduler iteration of a script run.

``record`` builds and writes records (scheduler process); ``timeline``
formats them as one line per step; ``render`` draws them as SVG/HTML.
"""
