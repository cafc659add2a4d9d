"""kubemoot.sim."""
