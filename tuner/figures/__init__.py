"""Judging figures, measured or stored, a layer below the targets: what a load of requests must serve to count and
whether it meets an SLO (``serving``), and a re-run of an exported script against the figures it recorded
(``verification``). The targets measure with them; the export, ``tuner best`` and ``tuner verify`` read stored
figures with them."""
