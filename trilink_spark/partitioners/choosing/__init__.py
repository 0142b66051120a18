"""Choosing and changing a placement: the one catalogue of strategies, their evaluation,
the paper's scenarios, and the minimal-move refit."""
