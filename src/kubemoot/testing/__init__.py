"""kubemoot.testing."""
