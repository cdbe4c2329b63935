"""Scaling ML Labs: the plumbing behind the notebooks, one module per concern."""
