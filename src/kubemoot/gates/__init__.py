"""kubemoot.gates."""
