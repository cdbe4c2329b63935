"""The cluster simulator: the engine's protocols in simulated time (simulator.py)."""
