"""kubemoot.agent."""
