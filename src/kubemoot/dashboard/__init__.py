"""kubemoot.dashboard."""
