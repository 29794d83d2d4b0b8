"""Offline evaluations behind `ticketflow eval`: the models on the held-out set (models.py),
the after_sales route on hand-written fixtures (after_sales.py), the decisions of the
default workflow (decisions.py) and their arithmetic (report.py).

Not a runtime package: it may import the runtime packages, none of them imports it.
"""
