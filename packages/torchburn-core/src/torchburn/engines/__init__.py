"""Engines: the interface every engine implements, their discovery, and the built-in reference engine."""
